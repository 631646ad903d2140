"""Passkey and needle-in-a-haystack retrieval (Mohtashami & Jaggi 2023; RULER, Hsieh et al. 2024): one generator
for `data=retrieval` (a task small models learn at 512 tokens) and for `eval.py mode=retrieval` / its lm-eval tasks
(evals/retrieval.py) at any length, for any tokenizer.

An example is a prompt of exactly (word-level tokenizers) or at most `length` tokens and an answer:

    intro \\n haystack ... needle ... haystack \\n question answer_prefix  ->  " answer"

    family           needles (key -> value)                             asked for
    passkey          "The pass key is V. Remember it. V is the pass key."  the pass key: V
    niah_single      "One of the special magic numbers for K is: V."      V
    niah_multikey    the needle and 3 distractors of the same form        the value of one key
    niah_multivalue  4 needles of one key, 4 values                       all 4 values, in the text's order
    niah_multiquery  4 needles, 4 keys                                    all 4 keys' values, in the asked order

The needle the question asks for first sits at the asked depth: the haystack boundary nearest to depth x the
haystack's tokens (0: right after the intro, 1: right before the question); the others at boundaries drawn from
the example's seed. Haystacks: `repeat` (the passkey test's filler sentences, over and over), `noise` (words drawn
at random: data=retrieval's training distribution), or documents' sentences (`documents(...)`: the shipped
embedded corpus or the user's data=text files), read on from a random sentence.

Lengths are in the tokenizer's tokens, counted by encoding each piece with the space that precedes it; every piece
but the intro starts with a space or a newline, so the counts add up for word-level and byte-level BPE tokenizers
alike (checked on the whole prompt where it matters: `Example.tokens`). A word-level tokenizer (data=retrieval's
`symbols`) sees every digit and punctuation mark as a word of its own (`words()`).

Answers are scored as RULER scores them (evals/retrieval.py): the share of the expected values found in the
greedy continuation, and the answer's log-likelihood under teacher forcing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from duality.common.errors import ConfigError

from . import EvalSet, Examples, TaskData, compact, options

FAMILIES = ("passkey", "niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery")
HAYSTACKS = ("repeat", "noise", "embedded", "text")
VALUES = ("numbers", "words")
# the passkey test's filler and intro (Mohtashami & Jaggi 2023, section 4.2); RULER's NIAH templates (section 3)
REPEAT = ("The grass is green.", "The sky is blue.", "The sun is yellow.", "Here we go.", "There and back again.")
PASSKEY_INTRO = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
                 "I will quiz you about the important information there.")
PASSKEY_NEEDLE = "The pass key is {value}. Remember it. {value} is the pass key."
PASSKEY_QUESTION = "What is the pass key? The pass key is"
NIAH_INTRO = ("Some special magic {what} are hidden within the following text. Make sure to memorize it. "
              "I will quiz you about the {what} afterwards.")
NIAH_NEEDLE = "One of the special magic {what} for {key} is: {value}."
NIAH_QUESTION = {1: "What is the special magic {one} for {query} mentioned in the provided text? "
                    "The special magic {one} for {query} mentioned in the provided text is",
                 4: "What are all the special magic {what} for {query} mentioned in the provided text? "
                    "The special magic {what} for {query} mentioned in the provided text are"}
# keys (RULER's are random English words) and the words of `noise` haystacks and word values: disjoint lists
KEYS = """apple anchor arrow badge banner barrel basket beacon bell blanket bottle bracelet bridge bucket button cabin
candle canvas carpet castle cellar chain chair channel chimney circle clock cloud collar comet compass copper cotton
crane crown crystal curtain cushion desert diamond dragon drum eagle engine falcon feather fence ferry flag flute
forest fountain garden garlic glacier globe glove harbor harvest helmet hammer island ivory jacket jungle kettle
ladder lantern lemon library lighthouse magnet maple marble meadow mirror monkey mountain needle oasis orchard
oyster paddle palace parrot pebble pepper piano pillow pirate planet pocket pumpkin puzzle quilt rabbit ribbon
rocket saddle sailor satchel scarf shelter shovel silver spider statue stone tiger tower trumpet tunnel umbrella
valley velvet violin wagon walnut whistle window wizard""".split()
NOISE = """able about above across after again against almost along always among another around away became
because before began behind being below beside best better between beyond both brief brought built came cannot
careful carried certain change clear close common could count cover daily different done down during each early
either else enough even ever every fast few final find first follow found four free full gave give given goes
going good great half hand hard having heard help high hold home however idea into just keep kind known large
last late later least less light like line little long look made make many might more most move much must near
never next night often once only open order other over part place plain point quite rather ready real round said
same seen several short should show side since small some soon still such sure take than then there these thing
those though three through told took toward turn under until upon used usual very want well went were what when
where which while whole will with within without word work would year young""".split()
PUNCT = list(".,:?!'-")


@dataclass
class Example:
    prompt: str  # the text before the answer (no trailing space)
    answer: str  # the continuation, with its leading space: " 1234567", " 12, 34, 56, 78"
    values: list[str]  # what RULER's string match looks for in the generated text
    ids: np.ndarray  # the prompt's tokens
    answer_ids: np.ndarray  # the answer's tokens
    depth: float  # the asked-for needle's depth: its first token's place in the haystack's tokens, 0..1
    family: str
    length: int  # the length asked for (the prompt has at most this many tokens)


def words(text: str) -> str:
    """A text as a word-level tokenizer reads it: every digit and punctuation mark a word of its own."""
    return " ".join(re.findall(r"\d|[A-Za-z]+|[^\sA-Za-z\d]", text))


def vocabulary() -> list[str]:
    """The symbols of data=retrieval (and of any word-level model that runs these tasks): every word of the
    templates, the fillers, the keys and the noise, the digits and the punctuation; id 0 is <pad>."""
    found = set(PUNCT) | {str(d) for d in range(10)} | set(KEYS) | set(NOISE)
    for t in (*REPEAT, PASSKEY_INTRO, PASSKEY_NEEDLE, PASSKEY_QUESTION, *NIAH_QUESTION.values(), NIAH_INTRO,
              NIAH_NEEDLE):
        for what in ("numbers", "words"):
            found.update(words(t.format(what=what, one=what[:-1], key="", value="", query="")).split())
    found.update({"and"})
    return ["<pad>", *sorted(found)]


class Encoder:
    """A tokenizer's encode as this generator uses it: word_level tokenizers see `words(text)`; token counts of
    pieces cached (haystack sentences recur)."""

    def __init__(self, encode, word_level: bool):
        self.encode_fn, self.word_level = encode, word_level
        self._cache: dict[str, np.ndarray] = {}

    def text(self, s: str) -> str:
        return words(s) if self.word_level else s

    def piece(self, s: str, lead: str = " ") -> np.ndarray:
        """The tokens of `s` as it appears after `lead` (a space or a newline) in the prompt."""
        key = lead + s
        if key not in self._cache:
            if self.word_level:
                ids = self.encode_fn(words(s))
            else:
                ids = self.encode_fn(key)
            self._cache[key] = np.asarray(ids, dtype=np.int64)
            if len(self._cache) > 200_000:
                self._cache.clear()
        return self._cache[key]

    def join(self, parts: list[tuple[str, str]]) -> str:
        """The prompt text of (lead, piece) parts."""
        if self.word_level:
            return " ".join(words(p) for _, p in parts)
        return "".join(lead + p for lead, p in parts)


def documents_sentences(docs) -> list[str]:
    """Sentences of documents, in order: a haystack read on from a random one."""
    out = []
    for d in docs:
        for s in re.split(r"(?<=[.!?])\s+", " ".join(d.split())):
            if s:
                out.append(s)
    return out


@lru_cache(maxsize=1)
def embedded_sentences() -> tuple[str, ...]:
    from duality.data.embedded import documents
    return tuple(documents_sentences(documents()))


def _value(rng, values: str, digits: int) -> str:
    if values == "numbers":
        return str(int(rng.integers(10 ** (digits - 1), 10 ** digits)))
    return NOISE[int(rng.integers(len(NOISE)))] + "-" + NOISE[int(rng.integers(len(NOISE)))]


def _needles(family: str, rng, values: str, digits: int):
    """(intro, needle texts, each needle's value, question, the needles asked for in the asked order); needle 0 is
    the one placed at the asked depth. niah_multivalue's answer is its values in the text's order (make_example)."""
    what = "numbers" if values == "numbers" else "words"
    if family == "passkey":
        v = str(int(rng.integers(10 ** (digits - 1), 10 ** digits)))
        return PASSKEY_INTRO, [PASSKEY_NEEDLE.format(value=v)], [v], PASSKEY_QUESTION, [0]
    n_keys = {"niah_single": 1, "niah_multikey": 4, "niah_multivalue": 1, "niah_multiquery": 4}[family]
    n_vals = 4 if family == "niah_multivalue" else 1
    keys = [KEYS[i] for i in rng.choice(len(KEYS), n_keys, replace=False)]
    vals = [_value(rng, values, digits) for _ in range(n_keys * n_vals)]
    while len(set(vals)) < len(vals):  # distinct values: each one found means one thing
        vals = [_value(rng, values, digits) for _ in range(n_keys * n_vals)]
    owner = [keys[i // n_vals] for i in range(len(vals))]
    needles = [NIAH_NEEDLE.format(what=what, key=k, value=v) for k, v in zip(owner, vals)]
    asked = list(range(n_keys)) if family == "niah_multiquery" else list(range(n_vals))
    query = keys[0] if n_keys == 1 or family == "niah_multikey" else ", ".join(keys[:-1]) + ", and " + keys[-1]
    form = 4 if family in ("niah_multivalue", "niah_multiquery") else 1
    question = NIAH_QUESTION[form].format(what=what, one=what[:-1], query=query)
    return NIAH_INTRO.format(what=what), needles, vals, question, asked


def make_example(family: str, length: int, depth: float, rng: np.random.Generator, enc: Encoder,
                 haystack: str = "repeat", sentences=None, values: str = "numbers", digits: int = 7,
                 text: bool = True) -> Example:
    """One example of `family` whose prompt has at most `length` tokens (exactly, for a word-level tokenizer and
    the one-word units of `noise`), needle 0 at `depth` (0..1) of the haystack's tokens. text=False: ids only."""
    intro, needles, vals, question, asked = _needles(family, rng, values, digits)
    fixed = [enc.piece(intro, ""), enc.piece(question, "\n")] + [enc.piece(n) for n in needles]
    budget = length - sum(len(p) for p in fixed)
    if budget < 0:
        raise ConfigError(f"{family}: a prompt of {length} tokens cannot hold the intro, needles and question "
                          f"({length - budget} tokens)")
    # the haystack: units (a word of noise, else a sentence) with their tokens, up to the budget
    if haystack == "noise" and enc.word_level:  # one token a word: drawn at once
        units = [NOISE[i] for i in rng.integers(0, len(NOISE), budget)]
        unit_ids = [enc.piece(u) for u in units]
    elif haystack == "noise":
        units, unit_ids, total = [], [], 0
        while True:
            u = NOISE[int(rng.integers(len(NOISE)))]
            c = enc.piece(u)
            if total + len(c) > budget:
                break
            units.append(u)
            unit_ids.append(c)
            total += len(c)
    else:
        pool = REPEAT if haystack == "repeat" else sentences
        if not pool:
            raise ConfigError(f"haystack {haystack!r} has no sentences")
        i = 0 if haystack == "repeat" else int(rng.integers(len(pool)))
        units, unit_ids, total = [], [], 0
        while True:
            u = pool[i % len(pool)]
            c = enc.piece(u)
            if total + len(c) > budget:
                break
            if haystack != "repeat" and len(units) >= len(pool):
                raise ConfigError(f"the haystack holds {total:,} tokens; a {length:,}-token prompt needs about "
                                  f"{budget:,}: give longer files (or retrieval.haystack=repeat)")
            units.append(u)
            unit_ids.append(c)
            total += len(c)
            i += 1
    counts = np.array([len(c) for c in unit_ids], dtype=np.int64)
    cum = np.concatenate([[0], np.cumsum(counts)])
    total = int(cum[-1])
    # boundary b sits before unit b: needle 0 at the boundary nearest to depth x the haystack, the others at random
    spots = rng.integers(0, len(units) + 1, len(needles))
    spots[0] = int(np.argmin(np.abs(cum - depth * total)))
    placed = sorted(range(len(needles)), key=lambda j: (spots[j], j))
    parts, ids, u = [("", intro)], [fixed[0]], 0
    for j in placed + [None]:
        stop = len(units) if j is None else spots[j]
        parts += [(" ", w) for w in units[u:stop]]
        ids += unit_ids[u:stop]
        u = stop
        if j is not None:
            parts.append((" ", needles[j]))
            ids.append(fixed[2 + j])
    parts.append(("\n", question))
    ids.append(fixed[1])
    if family == "niah_multivalue":  # all values of the key, in the order the text gives them
        asked = placed
    answer = [vals[j] for j in asked]
    plain = ", ".join(answer)
    return Example(prompt=enc.join(parts) if text else "", answer=" " + enc.text(plain),
                   values=[enc.text(v) for v in answer], ids=np.concatenate(ids), answer_ids=enc.piece(plain),
                   depth=float(cum[spots[0]] / max(total, 1)), family=family, length=length)


# ------------------------------------------------------------------------------------------ data=retrieval
def build(cfg: dict) -> TaskData:
    """data=retrieval: examples of the chosen families in `noise` at seq_len tokens (prompt + answer), a loss on
    the answer's tokens only; evaluation sets at eval_lengths, an example right when every answer token is, scored
    per family as well (task_eval.json's curve_family)."""
    o = _defaults(**options(cfg, _defaults, "retrieval"))
    bad = [f for f in o["tasks"] if f not in FAMILIES]
    if bad or not o["tasks"]:
        raise ConfigError(f"data.tasks={list(o['tasks'])}: unknown {bad}; valid choices: {list(FAMILIES)}")
    if o["haystack"] not in ("noise", "repeat"):
        raise ConfigError(f"data.haystack={o['haystack']!r}: data=retrieval trains on noise or repeat")
    names = vocabulary()
    index = {w: i for i, w in enumerate(names)}
    enc = Encoder(lambda text: [index[w] for w in text.split()], word_level=True)

    def make(n, T, seed):
        rng = np.random.default_rng(seed)
        x = np.zeros((n, T), dtype=np.int64)
        y = np.full((n, T), -1, dtype=np.int64)
        fam = np.zeros(n, dtype=np.int64)  # each example's family, an index into o["tasks"]
        for r in range(n):
            fam[r] = int(rng.integers(len(o["tasks"])))
            family = o["tasks"][int(fam[r])]
            ex = make_example(family, T - A, float(rng.random()), rng, enc, o["haystack"], digits=o["digits"],
                              text=False)
            seq = np.concatenate([ex.ids, ex.answer_ids])
            x[r, :len(seq) - 1] = seq[:-1]
            y[r, len(ex.ids) - 1:len(seq) - 1] = ex.answer_ids
        return compact(x), compact(y), fam

    A = 4 * (o["digits"] + 1) + 2  # the longest answer (4 values) fits in every example
    for T in [o["seq_len"], *o["eval_lengths"]]:
        for family in o["tasks"]:
            try:
                make_example(family, T - A, 0.5, np.random.default_rng(0), enc, o["haystack"], digits=o["digits"],
                             text=False)
            except ConfigError as e:
                raise ConfigError(f"data=retrieval: length {T} is too short: {e}") from None
    x, y, _ = make(o["train_examples"], o["seq_len"], [o["seed"], 0])
    evals = []
    for T in o["eval_lengths"] or [o["seq_len"]]:
        ex, ey, fam = make(o["test_examples"], T, [o["seed"], 1, T])
        evals.append(EvalSet(ex, ey, length=T, exact=True, family=fam, families=tuple(o["tasks"])))
    return TaskData("retrieval", Examples(x, y, seed=o["seed"]), evals, symbols=names, train_len=o["seq_len"],
                    seq_len=o["seq_len"], info={"tasks": list(o["tasks"]), "haystack": o["haystack"]})


def _defaults(*, tasks=FAMILIES, seq_len=512, haystack="noise", digits=4, train_examples=50_000,
              test_examples=256, eval_lengths=(512, 1024, 2048), seed=0):
    return dict(locals())
