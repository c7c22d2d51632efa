"""longhaul: post-train language models into long-horizon agents.

`import longhaul` needs only torch and transformers; heavier optional pieces
(tensorboard, ray, fastapi, peft) are imported inside the modules that use them.
"""

__version__ = "0.1.0"

from longhaul.malloc import bound_kernel_caches as _bound_kernel_caches

_bound_kernel_caches()  # before any oneDNN kernel is built (longhaul.malloc)
