"""fairseq's own pointer-generator, ``transformer_pointer_generator``, under ``--user-dir fairseq_knowgen``.

The peer baseline of ``copy_transformer``: Enarvi et al. (2020), "Generating Medical
Reports from Patient-Doctor Conversations Using Sequence-to-Sequence Models", the transformer form
of See et al.'s (2017) pointer-generator, as fairseq ships it in
``fairseq/examples/pointer_generator/pointer_generator_src``. Its output distribution is the
mixture of the force-copy paper's Eq. 6 (See et al.'s Eq. 9),

    P(w) = p_gen P_vocab(w) + (1 - p_gen) sum_{i: x_i = w} a_i,

where it differs from our copy head (:mod:`fairseq_knowgen.modules.copy_generator`) in

- the switch (Eq. 5): p_gen = sigmoid(W [y_t; s_t] + b) from the decoder input embedding and
  output only (no context vector c_t);
- ``a``: the mean attention of the first ``--alignment-heads`` heads (default 1) of decoder layer
  ``--alignment-layer`` (default the last), not renormalized (EOS and ``<unk>`` can be copied);
- the mixture in probabilities, its log clamped at log 1e-10;
- training: the likelihood alone, p_gen unsupervised (``label_smoothed_cross_entropy``; no
  ``force_copy`` supervision).

fairseq takes one ``--user-dir``; importing this module (``fairseq_knowgen.models`` does) imports
fairseq's module, so ``--user-dir fairseq_knowgen`` registers ``transformer_pointer_generator``
and its ``_iwslt_de_en`` / ``_wmt_en_de*`` sizes beside our models, for training and for
decoding its checkpoints. The model is fairseq's, unchanged.

What it needs (``python -m fairseq_knowgen.prep.position_markers DATA_BIN`` checks the dictionary
and prints the flag K; the WebNLG recipe and ``scripts/benchmark.py`` add it):

- one joined dictionary whose *last* K entries are the position markers ``<unk-N>``: the model
  maps every id >= len(dict) - K to ``<unk>``'s embedding and gives those ids copy probability
  only. ``prep.placeholders encode`` writes ``dict.txt`` in that order (vocabulary, then
  ``<unk-0> .. <unk-{K-1}>``), and ``fairseq-preprocess --srcdict`` keeps it;
- a decoder output projection tied to its input embedding (``--share-decoder-input-output-embed``,
  or ``--share-all-embeddings`` as the recipes train every model): the model's output layer
  asserts len(dict) - K logits, and an untied projection has len(dict);
- ``--source-position-markers K``: without it the model takes K = ``--max-source-positions``
  (1024), which silently maps the last 1024 - K *words* to ``<unk>`` too (or fails on a small
  dictionary).

Its ``<unk-N>`` is ours: a word outside the vocabulary at source position N (fairseq's
``preprocess.py`` numbers every occurrence; ours numbers a repeated word by its first position,
so its copy probability collects on one id), and ``prep.placeholders restore`` puts source word N
back, for both models.
"""

import importlib

from fairseq.models import MODEL_REGISTRY

NAME = "transformer_pointer_generator"
MODULE = "fairseq.examples.pointer_generator.pointer_generator_src.transformer_pg"

# fairseq refuses a second registration of a name: the model is registered already when fairseq's
# module was imported under another name first (``--user-dir .../pointer_generator_src``)
if NAME not in MODEL_REGISTRY:
    importlib.import_module(MODULE)
