"""The visible matrix through a multi-layer K-BERT encoder, against computations written here
from the paper (K-BERT, section 02: M_ij = 0 where token i sees token j, -inf elsewhere,
added to Q K^T in the self-attention of every layer), and scripts/kbert_score.py's ``predict``
(tags read at the sentence characters' tree positions) with stub models whose outputs are known.

Through L layers the output at token i depends on the input at token j exactly when j is reached
from i in at most L steps of "sees" (the attention graph composed L times): a trunk token sees a
branch only through its mention, one layer later. A mask applied to the first layer only makes
every token depend on every token from layer 2 on."""

import importlib.util
import math
from argparse import Namespace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from fairseq.data import Dictionary
from helpers import build_task_and_model
from test_kbert import PAPER_SOFT, PAPER_TREE, PAPER_VISIBLE, as_matrix, paper_tree

from fairseq_knowgen.models.kbert import KBertEncoder, kbert_base_architecture

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "kbert_score.py"


def encoder(layers, dictionary, dim=16, heads=2):
    args = Namespace(
        encoder_layers=layers, encoder_embed_dim=dim, encoder_ffn_embed_dim=2 * dim, encoder_attention_heads=heads
    )
    kbert_base_architecture(args)
    torch.manual_seed(layers)
    enc = KBertEncoder(args, dictionary).eval()
    with torch.no_grad():  # larger weights than BERT's init (std 0.02), so that two-step paths show
        for name, p in enc.named_parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3)
    return enc


def paper_batch(dictionary, tokens=None):
    """The paper's sentence tree (12 tokens, soft positions from 1) as a batch of one."""
    tree = paper_tree()
    tokens = tree.tokens if tokens is None else tokens
    return dict(
        src_tokens=torch.tensor([[dictionary.index(t) for t in tokens]]),
        soft_positions=torch.tensor([tree.soft_positions]),
        branch_ids=torch.tensor([tree.branch_ids]),
        mention_ids=torch.tensor([tree.mention_ids]),
    )


def paper_dictionary():
    d = Dictionary()
    for t in paper_tree().tokens + ["X"]:
        d.add_symbol(t)
    return d


def reachable(sees: torch.Tensor, steps: int) -> torch.Tensor:
    """[i, j]: j is reached from i in at most ``steps`` steps of ``sees`` (which holds i -> i)."""
    reach = torch.eye(sees.size(0), dtype=torch.bool)
    for _ in range(steps):
        reach = (reach.float() @ sees.float()).gt(0)
    return reach


@pytest.mark.parametrize("layers", [1, 2, 3])
def test_each_output_depends_on_exactly_the_tokens_reachable_through_the_layers(layers):
    """Change one input token at a time: the outputs that change are exactly those whose token
    reaches it within ``layers`` steps of the paper's visible matrix (Tim sees Apple from layer 2
    on, through Cook; CEO sees China from layer 3 on, through Cook and Beijing)."""
    d = paper_dictionary()
    enc = encoder(layers, d).double()  # float64: an untouched output differs by 0, a reached one far more
    tokens = paper_tree().tokens
    with torch.no_grad():
        base = enc(**paper_batch(d))["encoder_out"][0][:, 0]  # T x C
        changed = torch.zeros(len(tokens), len(tokens), dtype=torch.bool)
        for j in range(len(tokens)):
            out = enc(**paper_batch(d, tokens[:j] + ["X"] + tokens[j + 1 :]))["encoder_out"][0][:, 0]
            diff = (out - base).abs().amax(-1)  # T
            assert not ((diff > 1e-12) & (diff < 1e-6)).any(), diff  # either untouched or clearly changed
            changed[:, j] = diff > 1e-6
    expected = reachable(as_matrix(PAPER_VISIBLE), layers)
    assert torch.equal(changed, expected), (changed ^ expected).nonzero().tolist()
    if layers == 2:  # a mask on the first layer only would make every output depend on every token
        assert not expected.all()


def reference_encoder(state, layers, heads, tokens, positions, visible):
    """A post-LN BERT encoder in plain torch with the paper's additive mask: per layer
    softmax(Q K^T / sqrt(d_k) + M) V, M = 0 where ``visible`` (B x T x T), -inf elsewhere."""
    w = lambda name: state[name]  # noqa: E731
    x = w("embed_tokens.weight")[tokens] + w("embed_positions.weight")[positions]  # B x T x C
    x = F.layer_norm(x, x.shape[-1:], w("layernorm_embedding.weight"), w("layernorm_embedding.bias"))
    mask = torch.zeros(visible.shape).masked_fill(~visible, -math.inf).unsqueeze(1)  # B x 1 x T x T
    bsz, tlen, dim = x.shape
    for layer in range(layers):
        p = lambda name: state[f"layers.{layer}.{name}"]  # noqa: E731

        def proj(name, h):
            return h @ p(f"{name}.weight").T + p(f"{name}.bias")

        def split(h):  # B x T x C -> B x H x T x C/H
            return h.view(bsz, tlen, heads, dim // heads).transpose(1, 2)

        q, k, v = (split(proj(f"self_attn.{n}_proj", x)) for n in "qkv")
        scores = q @ k.transpose(-1, -2) / math.sqrt(dim // heads) + mask  # B x H x T x T
        attn = (scores.softmax(-1) @ v).transpose(1, 2).reshape(bsz, tlen, dim)
        x = x + proj("self_attn.out_proj", attn)
        x = F.layer_norm(x, (dim,), p("self_attn_layer_norm.weight"), p("self_attn_layer_norm.bias"))
        x = x + proj("fc2", F.gelu(proj("fc1", x)))
        x = F.layer_norm(x, (dim,), p("final_layer_norm.weight"), p("final_layer_norm.bias"))
    return x


@pytest.mark.parametrize("ablation", [None, "no_visible_matrix", "no_soft_positions"])
def test_two_layer_encoder_equals_a_plain_torch_encoder_with_the_hand_written_mask(ablation):
    """A padded batch of two paper trees (the second cut after 'Apple'), through two layers: the
    encoder's outputs at every real token equal the reference's, whose mask is the paper's
    12 x 12 matrix and whose positions are the paper's soft positions, both written by hand
    (padded keys invisible). The ablations: every real token visible (``--no-visible-matrix``),
    positions 0..T-1 along the flattened tree (``--no-soft-positions``)."""
    d = paper_dictionary()
    enc = encoder(2, d)
    enc.use_visible_matrix = ablation != "no_visible_matrix"
    enc.use_soft_positions = ablation != "no_soft_positions"
    full = paper_batch(d)
    n, short = 12, 4  # "Tim Cook CEO Apple" (trunk Tim Cook and Cook's branch)
    batch = {k: torch.cat([v, F.pad(v[:, :short], (0, n - short))]) for k, v in full.items()}
    batch["src_tokens"][1, short:] = d.pad()
    pad = batch["src_tokens"].eq(d.pad())

    tokens = torch.tensor([[d.index(t) for t in PAPER_TREE]] * 2).masked_fill(pad, d.pad())
    visible = as_matrix(PAPER_VISIBLE) if ablation != "no_visible_matrix" else torch.ones(n, n, dtype=torch.bool)
    visible = visible.unsqueeze(0).repeat(2, 1, 1)
    visible[1, :, short:] = False  # padded keys
    visible[1, short:, :] = torch.eye(n, dtype=torch.bool)[short:]  # padded queries: themselves (no empty row)
    positions = torch.tensor([PAPER_SOFT] * 2) if ablation != "no_soft_positions" else torch.arange(n).repeat(2, 1)
    positions = (positions + d.pad() + 1).masked_fill(pad, d.pad())  # fairseq's learned positions: p + pad + 1
    with torch.no_grad():
        got = enc(**batch)["encoder_out"][0].transpose(0, 1)  # B x T x C
        ref = reference_encoder(enc.state_dict(), 2, 2, tokens, positions, visible)
    assert torch.allclose(got[~pad], ref[~pad], atol=1e-5), (got[~pad] - ref[~pad]).abs().max()
    # the short tree's real tokens equal the same tree alone (padding changes nothing)
    alone = {k: v[:, :short] for k, v in full.items()}
    with torch.no_grad():
        assert torch.allclose(enc(**alone)["encoder_out"][0][:, 0], got[1, :short], atol=1e-5)


# --- predict: the tags of the sentence characters, read at their tree positions --------------------------

TAG_OF = {"头": "B-D", "痛": "I-D", "发": "B-D", "热": "I-D", "咳": "B-D", "三": "O", "天": "O", "了": "O"}
SENTENCES = ["头 痛 三 天", "咳 了 三 天", "头 痛 发 热 了", "三 天", "发 热 头 痛 三 天 了 了 头 痛 发 热 头 痛"]


def load_script():
    """scripts/kbert_score.py as a module, without putting scripts/ on sys.path for later tests."""
    spec = importlib.util.spec_from_file_location("kbert_score", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class StubModel:
    """Logits that depend on the token only: sentence characters get their tag (``TAG_OF``),
    every other token (injected knowledge, <s>, </s>, padding) the tag ``B-KG``; as a
    classifier, the class named by the first sentence character."""

    def __init__(self, task, classes=None):
        self.task, self.classes = task, classes
        d, labels = task.source_dictionary, task.labels
        self.tag = torch.full((len(d),), labels.index("B-KG") if "B-KG" in labels else 0)
        for c, t in TAG_OF.items():
            if t in labels:
                self.tag[d.index(c)] = labels.index(t)

    def __call__(self, src_tokens, features_only=False, tagging_head_name=None, classification_head_name=None, **kw):
        assert features_only and (tagging_head_name or classification_head_name) == self.task.head_name
        if self.classes is None:
            return F.one_hot(self.tag[src_tokens], len(self.task.labels)).float(), {}  # B x T x tags
        first = [self.task.source_dictionary[t] for t in src_tokens[:, 1].tolist()]  # after <s>
        best = torch.tensor([self.task.labels.index(self.classes[c]) for c in first])
        return F.one_hot(best, len(self.task.labels)).float(), {}  # B x classes


def kbert_folder(tmp_path, rows, labels, header="text_a\tlabel"):
    d = Dictionary()
    for c in "头痛发热咳三天了症状疾病":
        d.add_symbol(c)
    d.save(str(tmp_path / "dict.txt"))
    (tmp_path / "labels.txt").write_text("\n".join(labels) + "\n", encoding="utf-8")
    (tmp_path / "valid.tsv").write_text("\n".join([header] + rows) + "\n", encoding="utf-8")
    (tmp_path / "kg.spo").write_text("头痛\t类别\t症状\n发热\t类别\t疾病\n咳\t类别\t症状\n", encoding="utf-8")
    return tmp_path


def test_predict_reads_the_tags_at_the_sentence_characters(tmp_path):
    """Each line gets one tag per character, the tag of that character: knowledge is injected
    after 头痛, 发热 and 咳, so reading tree positions 1..n (or any other than the trunk's) would
    return B-KG or a neighbour's tag; the long last sentence loses its tail to --max-positions 12
    (tagged O)."""
    rows = [f"{s}\t{' '.join('O' for _ in s.split())}" for s in SENTENCES]
    data = kbert_folder(tmp_path, rows, ["B-D", "B-KG", "I-D", "O"])
    task, _, _ = build_task_and_model(
        data, "kbert_small", "--kg", data / "kg.spo", "--max-positions", "12", task="kbert_tagging"
    )
    ds = task.dataset("valid")
    assert ds.injected_tokens > 0 and ds.dropped_trunk > 0
    preds = load_script().predict(StubModel(task), task, "valid", batch_size=2)
    expected = []
    for s in SENTENCES:
        chars = s.split()
        tags = [TAG_OF[c] for c in chars[:10]]  # 12 positions less <s> and </s>
        expected.append(" ".join(tags + ["O"] * (len(chars) - len(tags))))
    assert preds == expected


def test_predict_classification_keeps_the_file_order(tmp_path):
    """Batches are sorted by length; each prediction still lands on its own line."""
    classes = {"头": "A", "咳": "B", "发": "B", "三": "A"}
    rows = [f"{classes[s.split()[0]]}\t{s.replace(' ', '')}" for s in SENTENCES]
    data = kbert_folder(tmp_path, rows, ["A", "B"], header="label\ttext_a")
    task, _, _ = build_task_and_model(data, "kbert_small", "--kg", data / "kg.spo", task="kbert_classification")
    preds = load_script().predict(StubModel(task, classes), task, "valid", batch_size=2)
    assert preds == [r.split("\t")[0] for r in rows]
