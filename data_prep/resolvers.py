"""The Hydra config's resolvers: which target layers (and which slice of the data) a store captures.

`model.feature_layers` lists `hidden_states` indices (eagle/heads/feature_layers.py): [-1] for
EAGLE-1/2 heads; `head=eagle3` asks for the paper's low, middle and high layer plus the last
one (whose `lm_head` gives the target distribution the EAGLE-3 loss needs). These resolvers
keep the YAML short and the store directories apart; every entry point that composes
conf/config.yaml calls `register_resolvers()` before Hydra does:

    ${eagle3_layers:${model.num_layers}}   -> [2, N//2, N-3, -1]
    ${layers_tag:${model.feature_layers}}  -> "" for [-1], else "-layers2_15_27_-1"
    ${offset_tag:${data.offset}}           -> "" for 0, else "-from4096" (records passed over)
    ${repeats_tag:${data.mask_repeats}}    -> "" for null, else "-repeats8" (loops out of the loss)
    ${by_head:{eagle2: 5.0e-4, eagle3: 1.0e-3}}  -> the value for train.head (a model preset's
                                                    recipe tuned per head, which the head's own
                                                    defaults cannot override: presets come later)
"""

from __future__ import annotations

from omegaconf import ListConfig, OmegaConf

from eagle.heads.feature_layers import default_fused, store_layers


def eagle3_layers(num_layers) -> ListConfig:
    """The EAGLE-3 capture of an N-layer target: its three fused layers and the last (a
    ListConfig, which `OmegaConf.resolve` can store in place, unlike a list)."""
    if num_layers is None:
        raise ValueError("head=eagle3 needs model.num_layers (the target's decoder layers) to place its "
                         "three feature layers; set it in conf/model/NAME.yaml or pass model.feature_layers")
    return ListConfig(store_layers(default_fused(int(num_layers))))


def layers_tag(layers) -> str:
    """Suffix of the store directory: none for the EAGLE-1/2 default, the layers otherwise."""
    layers = [int(x) for x in layers]
    return "" if layers == [-1] else "-layers" + "_".join(str(x) for x in layers)


def offset_tag(offset) -> str:
    """Suffix of the store directory: none from the first record, "-fromN" from record N."""
    return f"-from{int(offset)}" if offset else ""


def repeats_tag(n) -> str:
    """Suffix of the store directory: none when every reply token counts, "-repeatsN" under data.mask_repeats=N."""
    return "" if n is None else f"-repeats{int(n)}"


def by_head(values, *, _root_) -> object:
    """The entry of `values` (head -> value) for the run's train.head."""
    head = _root_.train.head
    if head not in values:
        raise ValueError(f"${{by_head:...}} has no value for train.head={head}: it gives {', '.join(values)}")
    return values[head]


def register_resolvers() -> None:
    """Make the resolvers known to OmegaConf (idempotent)."""
    OmegaConf.register_new_resolver("eagle3_layers", eagle3_layers, replace=True)
    OmegaConf.register_new_resolver("layers_tag", layers_tag, replace=True)
    OmegaConf.register_new_resolver("offset_tag", offset_tag, replace=True)
    OmegaConf.register_new_resolver("repeats_tag", repeats_tag, replace=True)
    OmegaConf.register_new_resolver("by_head", by_head, replace=True)
