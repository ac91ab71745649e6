"""A checkpoint as fairseq-train writes it, made in-process from a built model, for tests of how fairseq's
loader rebuilds a model from the args a checkpoint carries (e.g. args saved before a flag existed)."""

import torch


def save_checkpoint(model, args, path, drop=(), **changes):
    """Write ``model``'s weights with ``args`` as the checkpoint's ``cfg.model``, the args named in ``drop``
    left out and ``changes`` set (as a checkpoint saved by an older version of the package would have them)."""
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from omegaconf import OmegaConf

    cfg = OmegaConf.to_container(convert_namespace_to_omegaconf(args), resolve=True, enum_to_str=True)
    for key in drop:
        delattr(cfg["model"], key)
    for key, value in changes.items():
        setattr(cfg["model"], key, value)
    history = [{"criterion_name": "x", "optimizer_name": "y", "lr_scheduler_state": {}, "num_updates": 1}]
    torch.save({"cfg": cfg, "model": model.state_dict(), "optimizer_history": history, "extra_state": {}}, path)
