"""longhaul: post-train language models into long-horizon agents.

`import longhaul` needs only torch and transformers; heavier optional pieces
(tensorboard, ray, fastapi, peft) are imported inside the modules that use them.
"""

__version__ = "0.1.0"
