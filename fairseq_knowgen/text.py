"""Text utilities shared by data preparation, datasets and evaluation (the bottom layer, beside
:mod:`fairseq_knowgen.textio`), so that prep and the metrics see text the same way:

- :func:`tokenize`: lower-cased word and punctuation tokens, the unit of every token-level metric;
- :func:`lemma`: an English lemma (``simplemma``), for concept coverage, EKI's concept labels
  and lemma-form constraints;
- :func:`moses_tokenize`: sacremoses English tokenization, the tokenization of every recipe's text;
- :class:`EntityMatcher`: the mentions of WebNLG source entities in a tokenized text. Prep
  replaces them by whole-entity placeholders ``<ent-K>`` (:mod:`fairseq_knowgen.prep.entities`),
  evaluation counts them (``entity_recall``), so the placeholder upper bound and the output-side
  recall count the same way.

Entity mentions are found on normalized text: case folded, accents and punctuation dropped
(``Arros Negre`` = ``Arròs negre``, ``Washington DC`` = ``Washington , D.C.``, ``1634 The Ram
Rebellion`` = ``1634 : The Ram Rebellion``), ``&`` read as ``and``; a mention starts and ends on
token boundaries. Besides the entity itself its variants are looked for (:func:`variants`):
without a disambiguating parenthesis (``Texas ( state )`` as ``Texas``), numbers without a
``.0`` and with or without their unit in the usual spellings (``28.0 ( metres )`` as ``28 m``),
dates in the usual English forms (``1927-07-23`` as ``July 23rd , 1927``, ``23 July 1927``,
``07/23/1927``), a place by its first part (``Austin , Texas`` as ``Austin``), a comma list with
``and``, a language by its name (``English language`` as ``English``) and, case-sensitively, a
name by its initials (``United States`` as ``US`` or ``U.S.``, not ``us``). The longest mention
wins and mentions never overlap (``Abilene , Texas`` before ``Texas`` inside it).
"""

import itertools
import re
import unicodedata
from typing import Dict, List, Sequence, Set, Tuple

_TOKEN_RE = re.compile(r"\w+|[^\w\s]", re.UNICODE)
_MOSES = {}


def tokenize(text: str) -> List[str]:
    """Lower-cased word and punctuation tokens, the unit of every token-level metric."""
    return _TOKEN_RE.findall(text.lower())


def lemma(word: str) -> str:
    """English lemma of a lower-cased word (simplemma's dictionary lookup)."""
    import simplemma

    return simplemma.lemmatize(word, lang="en").lower()


def moses_tokenize(text: str, lowercase: bool = True) -> str:
    """sacremoses English tokenization (no HTML escaping), optionally lower-cased."""
    if "en" not in _MOSES:
        from sacremoses import MosesTokenizer

        _MOSES["en"] = MosesTokenizer(lang="en")
    out = _MOSES["en"].tokenize(text.strip(), escape=False, return_str=True)
    return out.lower() if lowercase else out


# ---------------------------------------------------------------------------------------------
# Entity mentions (WebNLG)

ENTITY_TOKEN = re.compile(r"^<ent-(\d+)>$")
SURFACE_STYLES = ("text", "dbpedia")

MONTHS = "January February March April May June July August September October November December".split()
_ISO_DATE = re.compile(r"^(\d{4})-(\d\d)-(\d\d)$")
_NUMBER = re.compile(r"^-?\d[\d,]*(\.\d+)?$")
# letters that NFKD does not decompose into a base letter + accent
_FOLD = str.maketrans({"ø": "o", "đ": "d", "ł": "l", "ı": "i", "æ": "ae", "œ": "oe", "þ": "th", "ð": "d"})
# other spellings of unit words inside a numeric entity's parenthesis (``28.0 ( metres )``)
_UNIT_WORDS = {
    "metres": ("meters", "m"),
    "metre": ("meter", "metres", "meters", "m"),
    "kilometres": ("kilometers", "km"),
    "kilometre": ("kilometer", "kilometres", "kilometers", "km"),
    "square": ("sq",),
    "minutes": ("mins", "min"),
    "inhabitants": ("people", "residents"),
}


def entity_token(k: int) -> str:
    return f"<ent-{k}>"


def norm_token(token: str) -> str:
    """The comparison form of a token: case folded, accents and punctuation dropped (a decimal
    point between digits kept, thousands separators dropped), ``&`` read as ``and``."""
    if token == "&":
        return "and"
    t = unicodedata.normalize("NFKD", token.casefold()).translate(_FOLD)
    t = re.sub(r"(?<=\d)\.(?=\d)", "\x00", "".join(c for c in t if not unicodedata.combining(c)))
    return "".join(c for c in t if c.isalnum() or c == "\x00").replace("\x00", ".")


def key(text: str) -> str:
    """Normalized form of a space-tokenized string: its tokens' :func:`norm_token` joined
    without separators, so that tokenization and punctuation do not matter."""
    return "".join(norm_token(t) for t in text.split())


def _split_parenthesis(entity: str) -> Tuple[str, str]:
    """``Texas ( state )`` -> (``Texas``, ``state``); no trailing parenthesis: (entity, '')."""
    m = re.match(r"^(.*\S)\s+\(\s+(.*?)\s+\)$", entity)
    return (m.group(1), m.group(2)) if m else (entity, "")


def _date(entity: str):
    """(year, month, day) of a date entity: ISO ``1927-07-23``, ``30 March 2007`` or
    ``March 30 , 2007`` (None for anything else)."""
    m = _ISO_DATE.match(entity)
    if m:
        y, mo, d = (int(x) for x in m.groups())
    else:
        m = re.match(r"^(\d{1,2}) (\w+) (\d{4})$", entity) or re.match(r"^(\w+) (\d{1,2}) , (\d{4})$", entity)
        if not m:
            return None
        day, month = (m.group(1), m.group(2)) if m.group(1).isdigit() else (m.group(2), m.group(1))
        if month not in MONTHS:
            return None
        y, mo, d = int(m.group(3)), MONTHS.index(month) + 1, int(day)
    return (y, mo, d) if 1 <= mo <= 12 and 1 <= d <= 31 else None


def _ordinal(d: int) -> str:
    return f"{d}{'th' if 10 <= d % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(d % 10, 'th')}"


def _date_variants(y: int, mo: int, d: int) -> List[str]:
    month = MONTHS[mo - 1]
    months = (month, month[:3], "Sept") if mo == 9 else (month, month[:3])
    days = (str(d), f"{d:02d}", _ordinal(d))
    out = [f"{y}-{mo:02d}-{d:02d}", f"{y}.{mo:02d}.{d:02d}", f"{d:02d}.{mo:02d}.{y}"]
    out += [f"{mo:02d}/{d:02d}/{y}", f"{d:02d}/{mo:02d}/{y}", f"{mo}/{d}/{y}", f"{d}/{mo}/{y}"]
    for m, day in itertools.product(months, days):
        out += [f"{m} {day} , {y}", f"{day} {m} {y}", f"{day} of {m} {y}"]
    return out


def _number_variants(number: str) -> List[str]:
    """``28.0`` -> ``28.0``, ``28`` (thousands separators are dropped by :func:`norm_token`)."""
    out = [number]
    if re.search(r"\.0+$", number):
        out.append(re.sub(r"\.0+$", "", number))
    return out


def _unit_variants(unit: str) -> List[str]:
    words = [(w,) + _UNIT_WORDS.get(w.lower(), ()) for w in unit.split()]
    out = [" ".join(c) for c in itertools.product(*words)]
    m = re.match(r"^square (\S+)$", unit)  # km2, m2, km²
    if m:
        out += [f"{u}2" for u in (m.group(1),) + _UNIT_WORDS.get(m.group(1), ())]
    return out


def _language(entity: str) -> str:
    """``English`` for ``English language`` (DBpedia's name of a language), else ''."""
    m = re.match(r"^([A-Z][\w-]*) language$", entity)
    return m.group(1) if m else ""


def _place_head(entity: str) -> str:
    """``Austin`` for ``Austin , Texas`` (a capitalized place name, one comma, a capitalized
    region after it), else ''."""
    m = re.match(r"^([A-Z][^,]*) , ([A-Z][^,]*)$", entity)
    if not m or not all(w[0].isupper() or w in _LOWER_IN_NAMES for w in entity.replace(" , ", " ").split()):
        return ""
    return m.group(1)


def acronyms(entity: str) -> List[str]:
    """``US`` for ``United States``, ``MIT`` for ``Massachusetts Institute of Technology``:
    the initials of a name of at least two capitalized words (``of``, ``the``, ``and`` skipped).
    They are matched case-sensitively (``US`` but not ``us``), with or without periods."""
    words = _split_parenthesis(entity)[0].split()
    if len(words) < 2 or not all(w[0].isupper() and w.isalpha() or w in _LOWER_IN_NAMES for w in words):
        return []
    return ["".join(w[0] for w in words if w not in _LOWER_IN_NAMES)]


_LOWER_IN_NAMES = ("of", "the", "and", "de", "in", "at")


def variants(entity: str, style: str = "text") -> List[str]:
    """Text forms looked for in a reference for one source entity (space-tokenized, as in the
    linearized source), each matched case-insensitively up to punctuation and accents:

    - the entity; without its parenthesis (a disambiguation such as ``( state )``);
    - a number also without ``.0``, and with its unit (``28.0 ( metres )``) in the usual
      spellings (``28 metres``, ``28 m``, ``28.0 meters``) or without it (``28``);
    - a date in the usual English forms (``July 23rd , 1927``, ``23 Jul 1927``, ``07/23/1927``);
    - a place ``Austin , Texas`` also as ``Austin`` (restored as ``Austin , Texas``); another
      comma list ``bread , garlic , olive oil`` also with ``and`` or ``or`` before its last item;
    - a language ``English language`` as ``English`` only in the ``text`` style (whose surface
      is ``English``: ``the English language`` then becomes ``the <ent-K> language``).
    """
    lang = _language(entity)
    out = [] if lang and style == "text" else [entity]
    if lang:
        out.append(lang)
    base, paren = _split_parenthesis(entity)
    first = base.split()[0]
    if paren and _NUMBER.match(first):  # 28.0 ( metres ), 5.5 million ( dollars )
        rest = base.split()[1:]
        for n in _number_variants(first):
            head = " ".join([n] + rest)
            out.append(head)
            out += [f"{head} {u}" for u in _unit_variants(paren)]
    elif paren:
        out.append(base)
    elif _NUMBER.match(entity):
        out += _number_variants(entity)
    date = _date(entity)
    if date:
        out += _date_variants(*date)
    head = _place_head(entity)
    if head:
        out.append(head)
    elif " , " in entity and not date:  # a list: "a , b , c" also as "a , b and c" / "a , b or c"
        first, last = entity.rsplit(" , ", 1)
        out += [f"{first} and {last}", f"{first} or {last}"]
    return out


def surface_form(entity: str, style: str = "text") -> str:
    """What ``<ent-K>`` is restored to (space-tokenized). ``dbpedia``: the entity as in the
    source (the cleaned DBpedia form). ``text``: as English text writes it: a disambiguating
    parenthesis dropped (``Texas ( state )`` -> ``Texas``), a unit without parentheses
    (``28.0 ( metres )`` -> ``28.0 metres``), an ISO date spelled out (``1927-07-23`` ->
    ``July 23 , 1927``), a language by its name (``English language`` -> ``English``)."""
    if style not in SURFACE_STYLES:
        raise ValueError(f"unknown surface style {style!r} (one of {SURFACE_STYLES})")
    if style == "dbpedia":
        return entity
    if _ISO_DATE.match(entity) and _date(entity):
        y, mo, d = _date(entity)
        return f"{MONTHS[mo - 1]} {d} , {y}"
    if _language(entity):
        return _language(entity)
    base, paren = _split_parenthesis(entity)
    if paren and _NUMBER.match(base.split()[0]):
        return f"{base} {paren}"
    return base


class EntityMatcher:
    """Finds the mentions of a line's source entities in a tokenized text (see the module
    docstring and :func:`variants`); ``delexicalize`` replaces them by ``<ent-K>``.

    Where two entities share a normalized form (``Ajoblanco`` and ``Ajo blanco``), a mention
    goes to the one whose variant it spells exactly, else to the lower K.
    """

    def __init__(self, ents: Sequence[str], style: str = "text"):
        # normalized variant -> [(K, variant, case-sensitive)]
        self.keys: Dict[str, List[Tuple[int, str, bool]]] = {}
        for k, e in enumerate(ents):
            forms = [(v, False) for v in variants(e, style)] + [(v, True) for v in acronyms(e)]
            for v, exact in forms:
                kv = key(v)
                if kv and (k, v, exact) not in self.keys.setdefault(kv, []):
                    self.keys[kv].append((k, v, exact))

    @staticmethod
    def _choose(entries, span: Sequence[str]):
        """The K of a mention ``span`` among the entities sharing its normalized form (None:
        only case-sensitive forms that the span does not spell)."""
        text, compact = " ".join(span), "".join(span).replace(".", "")
        ok = [(text != v, k) for k, v, exact in entries if not exact or compact == v]
        return min(ok)[1] if ok else None

    def find(self, tokens: Sequence[str]) -> List[Tuple[int, int, int]]:
        """Non-overlapping mentions ``(first token, last token + 1, K)`` in text order, the
        longest (in normalized characters) chosen first, then the leftmost."""
        norms = [norm_token(t) for t in tokens]
        text = "".join(norms)
        starts: Dict[int, int] = {}  # char offset -> first non-empty token starting there
        ends: Dict[int, int] = {}  # char offset -> last non-empty token ending there
        pos = 0
        for i, n in enumerate(norms):
            if n:
                starts.setdefault(pos, i)
                pos += len(n)
                ends[pos] = i
        candidates = []
        for kv, entries in self.keys.items():
            at = text.find(kv)
            while at >= 0:
                if at in starts and at + len(kv) in ends:
                    i, j = starts[at], ends[at + len(kv)] + 1
                    k = self._choose(entries, tokens[i:j])
                    if k is not None:
                        candidates.append((-len(kv), i, j, k))
                at = text.find(kv, at + 1)
        taken = [False] * len(tokens)
        found = []
        for _, i, j, k in sorted(candidates):
            if not any(taken[i:j]):
                taken[i:j] = [True] * (j - i)
                found.append((i, j, k))
        return sorted(found)

    def delexicalize(self, tokens: Sequence[str]) -> Tuple[List[str], Set[int]]:
        """(tokens with every mention replaced by its ``<ent-K>``, the K found)."""
        out, last, found = [], 0, set()
        for i, j, k in self.find(tokens):
            out += list(tokens[last:i]) + [entity_token(k)]
            last = j
            found.add(k)
        return out + list(tokens[last:]), found
