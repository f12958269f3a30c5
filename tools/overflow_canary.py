# A deliberate heap-buffer over-read, which tools/sanitize.sh and tools/valgrind.sh must
# report (else their checks are not working): the RMSNorm backward kernel, called
# directly, with an rstd of 2000 entries for 4000 rows.  The public API refuses such a
# cache (resnorm._checks.training_cache).  Only reads: nothing is corrupted.
import numpy as np

from resnorm import _norms

x = np.ones((4000, 8))
_norms.rms_norm_backward(np.empty_like(x), None, x, x, None, np.ones(2000), 1, False)
