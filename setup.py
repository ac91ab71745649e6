"""fairseq-knowgen: knowledge and content control for neural text generation, as a fairseq plugin.

Install with ``bash scripts/setup_env.sh`` (creates ``.venv/``); that script pins torch and
installs fairseq-fixed without its dependencies, which is why ``install_requires`` leaves out
fairseq and torch: pip must never resolve a second torch.
"""
from setuptools import find_packages, setup

setup(
    name="fairseq-knowgen",
    version="0.1.0",
    description="Knowledge-aware text generation methods as registered fairseq components",
    packages=find_packages(include=["fairseq_knowgen", "fairseq_knowgen.*"]),
    python_requires=">=3.10",
    install_requires=[
        "sacremoses",
        "subword-nmt",
        "sacrebleu>=2.0",
        "rouge-score",
        "pycocoevalcap",
        "simplemma",
        "bm25s",  # prep.retrieval: EKI's BM25 prototypes
        "scipy",  # prep.retrieval: the TF-IDF matrices
        "scikit-learn",  # evaluation.kbert_floors: the TF-IDF baseline
    ],
    # pip install -e ".[convert,recipes]": none of them pulls another torch
    extras_require={
        # convert.hf_bert / hf_bart / hf_gpt2: read HuggingFace checkpoint folders; prep.wordpiece: a BERT's WordPiece
        "convert": ["transformers", "tokenizers", "safetensors"],
        "recipes": ["seqeval", "matplotlib"],  # scripts/kbert_score.py (strict IOB2 F1), the coverage plots
    },
    entry_points={"console_scripts": ["knowgen-evaluate=fairseq_knowgen.evaluation.cli:main"]},
)
