"""``eki_generation``: translation whose sources are ``concepts <sep> prototype``.

fairseq's ``translation`` task plus the source annotations of
:class:`~fairseq_knowgen.data.eki_dataset.EKIDataset` (group ids, position-indicator
distances, L_E labels), which reach the model as ``src_group`` / ``src_distance`` in
``net_input`` and the criterion as ``src_label``. Binarize with ``fairseq-preprocess`` as
for translation; keep ``<sep>`` out of BPE (``subword-nmt apply-bpe --glossaries '<sep>'``).
"""

from dataclasses import dataclass, field

from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask

from ..data.eki_dataset import EKIDataset


@dataclass
class EKIGenerationConfig(TranslationConfig):
    eki_max_distance: int = field(default=64, metadata={"help": "clip position-indicator distances here"})


@register_task("eki_generation", dataclass=EKIGenerationConfig)
class EKIGenerationTask(TranslationTask):
    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        super().load_dataset(split, epoch, combine, **kwargs)
        self.datasets[split] = EKIDataset(
            self.datasets[split], self.src_dict, self.cfg.eki_max_distance, path=f"{self.cfg.data}:{split}"
        )

    def build_dataset_for_inference(self, src_tokens, src_lengths, constraints=None):
        base = super().build_dataset_for_inference(src_tokens, src_lengths, constraints)
        return EKIDataset(base, self.src_dict, self.cfg.eki_max_distance, path="<inference>")
