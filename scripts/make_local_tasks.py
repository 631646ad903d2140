"""Write evals/local_tasks/*.jsonl: three small lm-eval tasks over the embedded corpus's held-out documents
(every 20th document, the validation split of data=embedded), one per request type:

    pydoc_mc        multiple_choice    the true second half of a sentence vs three from other sentences
    pydoc_ppl       loglikelihood_rolling  whole documents (word/byte perplexity, bits per byte)
    pydoc_complete  generate_until     the last words of a sentence, up to its full stop

They let `eval.py mode=lm_eval` run with no network, and show how to point a task YAML at local JSONL files.

    python scripts/make_local_tasks.py            # deterministic: the same files for the same Python version
"""

import json
import random
import re
from pathlib import Path

from duality.data.embedded import documents

OUT = Path(__file__).resolve().parents[1] / "evals" / "local_tasks"


def sentences(doc: str) -> list[str]:
    out = []
    for s in re.split(r"(?<=\.)\s+", " ".join(doc.split())):
        words = s.split()
        if 8 <= len(words) <= 40 and s.endswith(".") and s[0].isupper() and not re.search(r"[>{}\[\]|]", s):
            out.append(s)
    return out


def main():
    rng = random.Random(0)
    held_out = [d for i, d in enumerate(documents()) if i % 20 == 19]
    sents = [s for d in held_out for s in sentences(d)]
    rng.shuffle(sents)
    mc, complete = [], []
    for s in sents[:200]:
        words = s.split()
        cut = len(words) // 2
        others = [o.split() for o in rng.sample(sents, 3)]
        choices = [" " + " ".join(words[cut:])] + [" " + " ".join(o[len(o) // 2:]) for o in others]
        order = list(range(4))
        rng.shuffle(order)
        mc.append({"context": " ".join(words[:cut]), "choices": [choices[i] for i in order], "label": order.index(0)})
    for s in sents[200:300]:
        words = s.rstrip(".").split()
        complete.append({"context": " ".join(words[:-2]), "target": " " + " ".join(words[-2:])})
    ppl = [{"text": d[:2000]} for d in held_out if len(d) >= 500][:40]
    OUT.mkdir(parents=True, exist_ok=True)
    for name, rows in (("pydoc_mc", mc), ("pydoc_complete", complete), ("pydoc_ppl", ppl)):
        (OUT / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"{OUT / name}.jsonl: {len(rows)} examples")


if __name__ == "__main__":
    main()
