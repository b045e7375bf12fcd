"""Evaluation text: WikiText-2 when the shared data folder has it, else an English text made here.

The made text is for machines without ../shared/data (a user's clone): plain sentences written for this
project, arranged deterministically into paragraphs, with some paragraphs recurring the way topics recur
in an encyclopedia. It is not WikiText, so numbers measured on it are not comparable with published ones.
"""

from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path

SHARED_WIKITEXT = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "wikitext-2-raw-test.txt"

_SENTENCES = """\
The river rises in the northern hills and flows south through a wide valley before it reaches the sea.
In the early years of the century the town grew quickly around its railway station and its market.
The church was built of local stone in the twelfth century and was enlarged twice in the years that followed.
Most of the population worked on farms, in the mill or in the small harbour on the eastern shore.
The band recorded its second album in a single month and released it in the spring of the following year.
Critics praised the songs for their simple melodies, although some found the lyrics too sentimental.
The album reached the top ten in several countries and remained in the charts for most of the summer.
During the war the bridge was destroyed, and for three years the only crossing was a ferry near the old mill.
After the war the government rebuilt the bridge and widened the road that led to the capital.
The school opened with forty pupils and two teachers, and by the end of the decade it had more than three hundred.
The team won the league for the first time in its history after a long season with many close games.
Their coach later said that the victory was the result of patience, discipline and a very young squad.
The film follows a young woman who returns to her home village after many years abroad.
It was shot on location over eight weeks, mostly in the hills above the river and in the old town.
The game received positive reviews for its story, its music and the design of its large open world.
Players explore the island on foot or by boat, and they can trade with the people who live in its villages.
The species is found in forests and grasslands, where it feeds mainly on seeds, insects and small fruits.
Its population has declined in recent decades because of the loss of habitat and the spread of farming.
The castle stands on a rock above the harbour and was used as a prison during the eighteenth century.
Today it is a museum that tells the history of the region from the first settlers to the present day.
The city council approved a plan to build a new library next to the park and the central square.
Construction began in the autumn and the building was opened to the public two years later.
The storm formed over warm water in the south and moved slowly towards the coast over several days.
Heavy rain caused floods in many towns, and thousands of people left their homes until the water fell.
The novel was first published in three volumes and was later translated into more than twenty languages.
It tells the story of a family over four generations, from the old farm in the valley to the busy city.
The road was opened in stages between the two wars, and the final section through the mountains followed later.
It remains the main route between the coast and the towns of the interior, and it carries heavy traffic.
The election was held in the spring, and the new government took office at the beginning of the summer.
Its first decisions were to raise the pay of teachers and to build new hospitals in the smaller towns.
""".strip().splitlines()


def generated_text(n_paragraphs: int = 600, seed: int = 0) -> str:
    """Deterministic English paragraphs (about 1.2 MB for the default), separated by blank lines."""
    rng = random.Random(seed)
    paragraphs: list[str] = []
    for _ in range(n_paragraphs):
        if paragraphs and rng.random() < 0.3:
            paragraphs.append(rng.choice(paragraphs))  # topics recur
            continue
        start = rng.randrange(0, len(_SENTENCES) - 1, 2)
        picked = [_SENTENCES[start], _SENTENCES[start + 1]]
        picked += rng.sample(_SENTENCES, rng.randint(2, 4))
        paragraphs.append(" ".join(picked))
    return "\n\n".join(paragraphs) + "\n"


def eval_text(tmp_dir: Path) -> Path:
    """WikiText-2 (test split) from ../shared/data when present, else a generated text written to tmp_dir (created
    if missing: a fresh cache folder). The text is written to a temporary file first and renamed, so that another
    process never reads half of it."""
    if SHARED_WIKITEXT.is_file():
        return SHARED_WIKITEXT
    path = Path(tmp_dir) / "tqgguf-generated-text.txt"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tqgguf-text-")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(generated_text())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return path
