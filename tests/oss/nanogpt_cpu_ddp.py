# A config file for nanoGPT's train.py, in nanoGPT's own format (configurator.py exec()s it in train.py's
# globals, before the DDP set-up): DDP with gloo on CPU, a tiny model, the data set tests/support/oss_jobs.py writes.
# Written by hangscope's tests; train.py, model.py and configurator.py beside it are nanoGPT's, unmodified.
# Usage: cd tests/oss/nanogpt && torchrun ... train.py ../nanogpt_cpu_ddp.py --dataset=DIR --out_dir=DIR
backend = 'gloo'
device = 'cpu'
dtype = 'float32'
compile = False
# a tiny GPT: each iteration is a few milliseconds of compute per micro step on one core
n_layer = 2
n_head = 2
n_embd = 32
block_size = 32
batch_size = 4
bias = False
dropout = 0.0
gradient_accumulation_steps = 16  # divided by the world size (8): 2 micro steps per rank, all_reduce in the last
# no evaluation (rank 0 alone would run it at iteration 0) and no checkpoint: train until stopped
eval_interval = 10 ** 9
eval_iters = 1
always_save_checkpoint = False
max_iters = 10 ** 9
warmup_iters = 10
lr_decay_iters = 10 ** 9
log_interval = 1
wandb_log = False

# Under DDP train.py picks a CUDA device after reading this file:
#     device = f'cuda:{ddp_local_rank}'; torch.cuda.set_device(device)
# and wraps the model with DDP(model, device_ids=[ddp_local_rank]), which DDP refuses for a CPU module. This
# file runs in train.py's globals, so it can make both calls what they are on a CPU-only node: set_device puts
# the script's `device` back to this file's, and DDP is called without device ids.
_cpu_device = device


def _set_device_on_cpu_node(_requested):
    global device
    device = _cpu_device


torch.cuda.set_device = _set_device_on_cpu_node

_DistributedDataParallel = DDP


def DDP(module, device_ids=None, **kwargs):  # the name train.py calls
    return _DistributedDataParallel(module, **kwargs)
