"""Run under mpirun: every rank loads its shard of the tiny model; rank 0 saves the prompt's logits (npy)."""
import sys

import numpy as np

from cupyglm.backend.numpy_ops import NumpyOps
from cupyglm.checkpoint.loader import open_model
from cupyglm.distributed.failure import run_rank_main
from cupyglm.distributed.world import start
from cupyglm.engine.runner import ModelRunner
from cupyglm.model.glm import SeqInput
from cupyglm.settings import Settings


def main(out_path: str) -> None:
    world = start(Settings.from_argv(["--backend", "numpy"]))
    ckpt = open_model(None)
    runner = ModelRunner(ckpt, NumpyOps(), world.comm, num_pages=8, page_tokens=16, poison=True)
    tokens = np.arange(100, 150, dtype=np.int32)
    logits = runner.forward([SeqInput(tokens, runner.new_state(), all_logits=True)])[0].logits
    if world.rank == 0:
        np.save(out_path, logits)


if __name__ == "__main__":
    sys.exit(run_rank_main(lambda: main(sys.argv[1])))
