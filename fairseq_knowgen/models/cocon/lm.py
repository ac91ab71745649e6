"""The frozen ``transformer_lm``: its dictionary, checked against the task's, and its loading."""

import os
from typing import Optional

from fairseq.data import Dictionary

from .config import CoConSetupError


def lm_dictionary_path(lm_path: str, cfg, given: Optional[str]) -> str:
    if given:
        return given
    beside = os.path.join(os.path.dirname(os.path.abspath(lm_path)), "dict.txt")
    if os.path.isfile(beside):
        return beside
    data = None
    try:
        data = cfg["task"]["data"]
    except (KeyError, TypeError):
        pass
    if data:
        p = os.path.join(str(data).split(os.pathsep)[0], "dict.txt")
        if os.path.isfile(p):
            return p
    raise CoConSetupError(
        f"{lm_path}: no dictionary found for this LM (looked for {beside} and its data folder's dict.txt): "
        "give --cocon-lm-dict"
    )


def check_dictionary_prefix(lm_dict: Dictionary, task_dict: Dictionary, lm_dict_path: str):
    n = len(lm_dict)
    if len(task_dict) < n or lm_dict.symbols != task_dict.symbols[:n]:
        m = min(n, len(task_dict))
        i = next((i for i in range(m) if lm_dict.symbols[i] != task_dict.symbols[i]), m)
        what = (
            f"first difference at id {i}: {lm_dict.symbols[i]!r} (LM) vs {task_dict.symbols[i]!r} (data)"
            if i < m
            else f"the LM has {n} symbols, the data {len(task_dict)}"
        )
        raise CoConSetupError(
            f"{lm_dict_path}: the LM's dictionary differs from the data's ({what}): binarize the data with the "
            "LM's dictionary (fairseq-preprocess --srcdict)"
        )


def load_frozen_lm(path: str, task_dict: Dictionary, dict_path: Optional[str] = None):
    """The decoder of a fairseq ``transformer_lm`` checkpoint, frozen and in eval mode."""
    from fairseq import checkpoint_utils
    from fairseq.models.transformer_lm import TransformerLanguageModel
    from fairseq.tasks.language_modeling import LanguageModelingTask

    if not path:
        raise CoConSetupError("--cocon-lm-path is required: a fairseq transformer_lm checkpoint")
    if not os.path.isfile(path):
        raise CoConSetupError(f"{path}: LM checkpoint not found (--cocon-lm-path)")
    try:
        state = checkpoint_utils.load_checkpoint_to_cpu(path)
    except Exception as e:  # a truncated or foreign file: name it
        raise CoConSetupError(f"{path}: not a readable fairseq checkpoint ({type(e).__name__}: {e})") from None
    cfg = state.get("cfg")
    if cfg is None or "model" not in state:
        raise CoConSetupError(f"{path}: not a fairseq checkpoint (no 'cfg'/'model' entries)")
    dpath = lm_dictionary_path(path, cfg, dict_path)
    lm_dict = Dictionary.load(dpath)
    check_dictionary_prefix(lm_dict, task_dict, dpath)
    lm_task = LanguageModelingTask(cfg.task, lm_dict)
    try:
        lm = lm_task.build_model(cfg.model)
    except Exception as e:
        raise CoConSetupError(f"{path}: cannot build its model ({type(e).__name__}: {e})") from None
    if not isinstance(lm, TransformerLanguageModel):
        raise CoConSetupError(f"{path}: a {type(lm).__name__}, not a transformer_lm checkpoint")
    try:
        lm.load_state_dict(state["model"], strict=True, model_cfg=cfg.model)
    except RuntimeError as e:
        raise CoConSetupError(f"{path}: its weights do not fit its configuration ({e})") from None
    dec = lm.decoder
    if dec.adaptive_softmax is not None:
        raise CoConSetupError(f"{path}: LMs with an adaptive softmax are not supported")
    for p in dec.parameters():
        p.requires_grad_(False)
    return dec.eval()


def lm_activation(lm) -> str:
    """The activation of the LM's FFNs (its layers keep the function, its config the name)."""
    cfg = getattr(lm, "cfg", None)
    name = getattr(cfg, "activation_fn", None) if cfg is not None else None
    return str(name) if name else "relu"
