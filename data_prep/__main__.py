"""`python -m data_prep +model=NAME data=NAME data.limit=N [store_dir=DIR]` (Hydra)."""

import logging
import sys

import hydra
from omegaconf import DictConfig

from data_prep.resolvers import register_resolvers


@hydra.main(version_base=None, config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    from data_prep.conversations import DataError
    from data_prep.data_config import prep_config
    from data_prep.pipeline import prepare
    from data_prep.plan import store_plan
    from eagle.common import distributed
    from eagle.common.locks import Busy

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        prep = prep_config(cfg)  # the one conversion of this job's config
        if prep.plan:
            print("\n".join(store_plan(prep).lines()))
            return
        path = prepare(prep)
        distributed.leave()
    except (DataError, ValueError, OSError, Busy) as e:  # OSError: a full disk, a folder it cannot write
        sys.exit(f"error: {e}")
    print(path)


if __name__ == "__main__":
    from eagle.common.allocator import use_fast_allocator

    use_fast_allocator()  # re-executes once with mimalloc preloaded (eagle/common/allocator.py)
    from data_prep.presets import ignored_key, unknown_model

    if message := unknown_model(sys.argv[1:]) or ignored_key(sys.argv[1:]):
        sys.exit(message)
    register_resolvers()
    main()
