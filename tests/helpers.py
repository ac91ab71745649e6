"""Building models in-process from fairseq command-line arguments."""

from fairseq import options, tasks


def build_task_and_model(data_dir, arch, *extra, task="translation"):
    import fairseq_knowgen  # noqa: F401

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser, [str(data_dir), "--task", task, "--arch", arch, "--cpu", *map(str, extra)]
    )
    t = tasks.setup_task(args)
    t.load_dataset("valid")
    return t, t.build_model(args), args


def first_batch(task, split="valid", max_sentences=6):
    itr = task.get_batch_iterator(
        task.dataset(split), max_sentences=max_sentences, ignore_invalid_inputs=True
    ).next_epoch_itr(shuffle=False)
    return next(itr)


def decode_full_and_stepwise(model, encoder_out, prev_output_tokens):
    """The decoder's output on the whole prefix at once, and step by step with an
    incremental state (a list of per-step outputs)."""
    import torch

    with torch.no_grad():
        full = model.decoder(prev_output_tokens, encoder_out=encoder_out)
        state = {}
        steps = [
            model.decoder(prev_output_tokens[:, : t + 1], encoder_out=encoder_out, incremental_state=state)
            for t in range(prev_output_tokens.size(1))
        ]
    return full, steps


def write_binarized(out_dir, splits, words=None):
    """``dict.txt`` and ``SPLIT.bin/.idx`` in ``out_dir`` as ``fairseq-preprocess --only-source`` writes
    them (each line and its ``</s>``), in-process: ``splits`` maps a split to its lines, ``words`` fixes the
    dictionary's order (default: by first appearance). Returns the dictionary."""
    import os

    from fairseq.data import Dictionary, indexed_dataset

    d = Dictionary()
    for w in words or [w for lines in splits.values() for line in lines for w in line.split()]:
        d.add_symbol(w)
    os.makedirs(out_dir, exist_ok=True)
    d.save(os.path.join(out_dir, "dict.txt"))
    for split, lines in splits.items():
        base = os.path.join(out_dir, split)
        builder = indexed_dataset.make_builder(base + ".bin", "mmap", vocab_size=len(d))
        for line in lines:
            builder.add_item(d.encode_line(line, add_if_not_exist=False, append_eos=True))
        builder.finalize(base + ".idx")
    return d
