"""Our EAGLE-3 exports read by speculators' own code (run by .consumers/speculators/bin/python).

    python scripts/consumers/speculators_check.py SPECULATORS_DIR EAGLE_DIR VERIFIER_DIR OUT.json

1. Eagle3DraftModel.from_pretrained(SPECULATORS_DIR): the keys it holds that our file has not
   (the target's, filled by load_verifier_weights) and the reverse, whether every tensor of our
   file arrives unchanged, and whether the embedding it takes from the verifier is the target's.
2. speculators' converter on EAGLE_DIR (our `eagle` layout): do its config fields and tensors
   equal our speculators export?
"""

import json
import shutil
import sys
import tempfile
from pathlib import Path


def main(spec_dir: str, eagle_dir: str, verifier: str, out_path: str) -> None:
    import torch
    from safetensors.torch import load_file
    from speculators.convert.eagle.eagle3_converter import Eagle3Converter
    from speculators.models.eagle3 import Eagle3DraftModel

    ours = load_file(str(Path(spec_dir) / "model.safetensors"))
    local = Path(tempfile.mkdtemp())  # the export, its verifier pointed at the local target (no Hub here)
    for f in Path(spec_dir).iterdir():
        shutil.copy(f, local / f.name)
    cfg = json.loads((local / "config.json").read_text())
    cfg["speculators_config"]["verifier"]["name_or_path"] = verifier
    (local / "config.json").write_text(json.dumps(cfg))
    model = Eagle3DraftModel.from_pretrained(str(local))
    held = model.state_dict()
    report = {
        "class": type(model).__name__,
        "not_in_file": sorted(set(held) - set(ours)), "not_in_model": sorted(set(ours) - set(held)),
        "tensors_equal": all(k in held and torch.equal(held[k].to(v.dtype), v) for k, v in ours.items()),
        "draft_vocab_size": model.config.draft_vocab_size,
        "norm_before_residual": model.config.norm_before_residual,
        "aux_layer_ids": model.config.eagle_aux_hidden_state_layer_ids,
    }
    model.load_verifier_weights()  # the embedding (and verifier norm/lm_head) the export leaves out
    target = load_file(str(Path(verifier) / "model.safetensors"))
    report["embedding_is_targets"] = torch.equal(model.embed_tokens.weight.detach().to(torch.float32),
                                                    target["model.embed_tokens.weight"].to(torch.float32))
    with tempfile.TemporaryDirectory() as tmp:
        # its converter reads norm_before_fc and norm_output from an EAGLE config, norm_before_residual
        # only as an argument (a user converting passes it)
        residual = json.loads((Path(eagle_dir) / "config.json").read_text()).get("norm_before_residual", False)
        Eagle3Converter().convert(eagle_dir, tmp, base_model=verifier, validate=False, norm_before_residual=residual)
        theirs = load_file(str(Path(tmp) / "model.safetensors"))
        cfg_theirs = json.loads((Path(tmp) / "config.json").read_text())
    cfg_ours = json.loads((Path(spec_dir) / "config.json").read_text())
    fields = ["speculators_model_type", "draft_vocab_size", "norm_before_residual", "norm_before_fc", "fc_norm",
              "norm_output", "tie_word_embeddings"]
    layer_fields = ["hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                    "num_hidden_layers", "vocab_size", "rms_norm_eps", "rope_parameters", "model_type"]
    report["converter_config_equal"] = {
        f: cfg_ours.get(f) == cfg_theirs.get(f) for f in fields} | {
        f"transformer_layer_config.{f}": cfg_ours["transformer_layer_config"].get(f)
        == cfg_theirs["transformer_layer_config"].get(f) for f in layer_fields}
    report["converter_keys_equal"] = sorted(ours) == sorted(theirs)
    report["converter_drops"] = sorted(set(ours) - set(theirs))  # its legacy model lacks the fc norm
    report["converter_tensors_equal"] = all(torch.equal(ours[k].to(theirs[k].dtype), theirs[k]) for k in theirs
                                            if k in ours)
    json.dump(report, open(out_path, "w"), indent=2)


if __name__ == "__main__":
    main(*sys.argv[1:])
