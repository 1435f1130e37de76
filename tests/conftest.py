import os

# Tests must not pick up more threads than the 2-core CI machine has.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
