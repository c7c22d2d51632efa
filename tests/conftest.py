import os
import tempfile

# Keep every test's model cache and runs away from the user's home.
os.environ.setdefault("LONGHAUL_HOME", tempfile.mkdtemp(prefix="longhaul-test-home-"))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
