"""The maths training and inference share, below both: the native CPU kernels (`kernels`, built
from `csrc/`), the linear layers' one dispatch and weight packing (`linear`), and rotary position
embeddings with their scaling types (`rope`). Imports neither `longhaul.rl` nor
`longhaul.inference`, so training never depends on how rollouts are generated."""
