import torch

# The test machine has 2 cores shared with other work.
torch.set_num_threads(2)
