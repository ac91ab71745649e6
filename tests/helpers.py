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
