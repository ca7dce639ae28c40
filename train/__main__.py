"""`python -m train +model=NAME [key=value ...]`: train an EAGLE draft head (Hydra app)."""

from __future__ import annotations

import logging
import os
import sys

import hydra
from omegaconf import DictConfig

from data_prep.resolvers import register_resolvers


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    from data_prep.conversations import DataError
    from eagle.common import distributed
    from eagle.common.locks import Busy
    from train.publish import PublishError
    from train.run import run

    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)  # its per-step INFO lines drown ours
    try:
        if cfg.get("plan"):  # the store's plan and training's (train/training_plan.py); nothing runs
            from train.config import validate
            from train.training_plan import training_plan

            print("\n".join(training_plan(validate(cfg)).lines()))
            return
        run(cfg)
        distributed.leave()  # every rank, once rank 0 has reported and published
    except (PublishError, DataError, OSError, ValueError, Busy) as e:  # OSError: full disk, unwritable folder
        if os.environ.get("EAGLE_TRACEBACK"):
            raise
        print(f"error: {e}  (EAGLE_TRACEBACK=1 shows where)", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    from eagle.common.allocator import use_fast_allocator

    use_fast_allocator()  # re-executes once with mimalloc preloaded (eagle/common/allocator.py)
    from data_prep.presets import unknown_model

    if message := unknown_model(sys.argv[1:]):
        sys.exit(message)
    register_resolvers()
    main()
