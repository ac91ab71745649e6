"""K-BERT's knowledge layer, part 2: the sentence tree, its soft positions and visible matrix.

K-BERT (Liu et al., 2020, "K-BERT: Enabling Language Representation with Knowledge Graph", section 02): each triple
``(mention, predicate, object)`` becomes a branch hung after its mention's last token; the tree is
flattened in that order ("Tim Cook [CEO Apple] is visiting Beijing [capital China] [is_a City]
now", 12 tokens).

Soft positions (the embedding layer, "軟位置編碼"): a branch continues numbering from its
mention's last token; every branch of a mention starts there again; the trunk goes on as if the
branches were absent. For the example (0-based): Tim 0, Cook 1, CEO 2, Apple 3, is 2, visiting 3,
Beijing 4, capital 5, China 6, is_a 5, City 6, now 5.

Visible matrix (the seeing layer, "可見矩陣"; the paper's M_ij is 0 where visible and -inf
elsewhere, added to Q K^T): token i sees token j iff

* both are trunk tokens; or
* both are in the same branch; or
* one is in a branch and the other is a token of that branch's mention (a mention sees all of its
  branches; two branches of one mention do not see each other).

Only three small integers are stored per token (soft position, branch id, mention id; 0 = none),
never a matrix: :func:`visible_matrix` builds the boolean B x T x T mask of a batch from them.

Truncation to ``max_len`` tokens drops whole branches before any trunk token, last mention first;
only a trunk longer than ``max_len`` on its own loses its tail (both counts are kept), so the
original code's fault (cutting the flattened tree, which pushes sentence tokens and their labels
out while injected tokens stay) cannot happen.

Sentence pairs (``[CLS] a [SEP] b [SEP]``, XNLI / LCQMC): as in the authors' ``run_kbert_cls.py``,
which builds one tree over the joined text, each sentence has its own branches, the soft positions
run on through ``[SEP]`` into b, and the visible matrix is that of one tree: every sentence token
(a's, b's and the ``[SEP]`` s) sees every other, while a branch of a is seen only by its own mention
in a (and likewise for b). :func:`build_pair_trees` keeps the pair within a length the same way:
branches go first (b's last mention first, then a's), then trunk tokens from the longer
sentence's tail, as BERT's ``truncate_seq_pair``.
"""

from dataclasses import dataclass, field
from typing import List, Optional, Sequence

import torch
from torch import Tensor

from .knowledge_graph import KnowledgeGraph, branch_tokens


@dataclass
class SentenceTree:
    """A flattened sentence tree: per token its text, soft position, branch id (0 = trunk, k > 0
    the k-th branch), mention id (0 = no mention, k > 0 the k-th mention; a branch carries its
    mention's id), and the tree index of each kept trunk token."""

    tokens: List[str] = field(default_factory=list)
    soft_positions: List[int] = field(default_factory=list)
    branch_ids: List[int] = field(default_factory=list)
    mention_ids: List[int] = field(default_factory=list)
    trunk_index: List[int] = field(default_factory=list)
    dropped_branches: int = 0
    dropped_trunk: int = 0

    def __len__(self) -> int:
        return len(self.tokens)


def build_sentence_tree(
    tokens: Sequence[str],
    kg: Optional[KnowledgeGraph],
    inject: str = "predicate-object",
    max_len: Optional[int] = None,
    start_position: int = 0,
    exclude=frozenset(),
    once: bool = False,
) -> SentenceTree:
    """The sentence tree of ``tokens`` with ``kg``'s branches (none when ``kg`` is ``None``).

    Args:
        tokens: the sentence (trunk) tokens
        kg: mentions and their triples (at most ``kg.max_entities`` each, in file order)
        inject: ``predicate-object`` or ``object`` (the tokens of each branch)
        max_len: drop branches (last mention first), then trunk tail tokens, beyond this length
        start_position: soft position of the first trunk token (1 when a ``<s>`` precedes it)
        exclude: ``(subject, predicate, object)`` token tuples not to inject (facts the input
            already states, e.g. a WebNLG source's own triples)
        once: a subject's branches hang on its first mention only (later mentions stay plain)
    """
    mentions = []  # [start, end, [branch tokens, ...]]
    if kg is not None:
        seen = set()
        for start, end in kg.mentions(tokens):
            if once and tuple(tokens[start:end]) in seen:
                continue
            seen.add(tuple(tokens[start:end]))
            branches = [branch_tokens(p, o, inject) for p, o in kg.triples_of(tokens[start:end], exclude)]
            branches = [b for b in branches if b]
            if branches:
                mentions.append([start, end, branches])
    n_trunk = len(tokens)
    total = n_trunk + sum(len(b) for m in mentions for b in m[2])
    tree = SentenceTree()
    if max_len is not None:
        for m in reversed(mentions):  # drop branches before trunk tokens, last mention first
            while m[2] and total > max_len:
                total -= len(m[2].pop())
                tree.dropped_branches += 1
        if n_trunk > max_len:
            tree.dropped_trunk = n_trunk - max_len
            n_trunk = max_len
    mentions = [m for m in mentions if m[2] and m[1] <= n_trunk]
    mention_at = {}  # token index -> (mention id, mention)
    for k, m in enumerate(mentions, start=1):
        for i in range(m[0], m[1]):
            mention_at[i] = (k, m)
    branch_id = 0
    for i in range(n_trunk):
        k, m = mention_at.get(i, (0, None))
        tree.trunk_index.append(len(tree.tokens))
        tree.tokens.append(tokens[i])
        tree.soft_positions.append(start_position + i)
        tree.branch_ids.append(0)
        tree.mention_ids.append(k)
        if m is not None and i == m[1] - 1:  # after the mention's last token: its branches
            for branch in m[2]:
                branch_id += 1
                for j, tok in enumerate(branch, start=1):
                    tree.tokens.append(tok)
                    tree.soft_positions.append(start_position + i + j)
                    tree.branch_ids.append(branch_id)
                    tree.mention_ids.append(k)
    return tree


def build_pair_trees(
    tokens_a: Sequence[str],
    tokens_b: Sequence[str],
    kg: Optional[KnowledgeGraph],
    inject: str = "predicate-object",
    max_len: Optional[int] = None,
):
    """The sentence trees ``(a, b)`` of a pair, together at most ``max_len`` tokens (soft positions
    from 0 in each; the caller shifts b's and numbers branches and mentions apart, see
    ``data.kbert_dataset``)."""
    full_a = build_sentence_tree(tokens_a, kg, inject)
    if max_len is None:
        return full_a, build_sentence_tree(tokens_b, kg, inject)
    n_a, n_b = len(tokens_a), len(tokens_b)
    if n_a + n_b > max_len:  # no room for any branch: trunks cut from the longer one's tail
        while n_a + n_b > max_len:
            n_a, n_b = (n_a - 1, n_b) if n_a >= n_b else (n_a, n_b - 1)
        return build_sentence_tree(tokens_a, kg, inject, n_a), build_sentence_tree(tokens_b, kg, inject, n_b)
    b = build_sentence_tree(tokens_b, kg, inject, max(max_len - len(full_a), n_b))  # b's branches go first
    return build_sentence_tree(tokens_a, kg, inject, max_len - len(b)), b


def visible_matrix(branch_ids: Tensor, mention_ids: Tensor, padding_mask: Optional[Tensor] = None) -> Tensor:
    """The boolean visible matrix of a batch (True = may attend).

    Args:
        branch_ids: B x T (0 trunk, k > 0 branch k)
        mention_ids: B x T (0 none, k > 0 mention k; branch tokens carry their mention's id)
        padding_mask: B x T, True at padding; padded keys are invisible (a padded query sees
            itself only, so that no row is empty)

    Returns:
        B x T x T bool, ``[b, i, j]`` = token i may attend to token j
    """
    bi, bj = branch_ids.unsqueeze(2), branch_ids.unsqueeze(1)  # B x T x 1, B x 1 x T
    mi, mj = mention_ids.unsqueeze(2), mention_ids.unsqueeze(1)
    trunk_i, trunk_j = bi == 0, bj == 0
    visible = (trunk_i & trunk_j) | ((bi == bj) & ~trunk_i) | ((mi == mj) & (mi > 0) & (trunk_i != trunk_j))
    if padding_mask is not None:
        pad_i, pad_j = padding_mask.unsqueeze(2), padding_mask.unsqueeze(1)
        eye = torch.eye(branch_ids.size(1), dtype=torch.bool, device=branch_ids.device).unsqueeze(0)
        visible = (visible & ~pad_i & ~pad_j) | (eye & pad_i)
    return visible
