"""The generator of the embedded corpus: short village tales from a small seeded grammar.

The shipped ``corpus.txt`` is exactly ``generate_tales()``; ``python -m brickwork.data.tales`` writes
it again. The text is generated, so it is free of any copyright. Its structure is learnable at small
scale: recurring characters keep their pronouns, counts add up, questions get answers in kind, so a
model's validation loss falls well below that of letter frequencies within a minute of CPU training.
"""

from __future__ import annotations

import random
from pathlib import Path


def _words(text: str) -> list[str]:
    return text.split()


# Each character keeps one pronoun set through every tale.
CHARACTERS = {name: ("she", "her") for name in _words("Ada Cora Edda Greta Ines Kira Mira Olga")}
CHARACTERS |= {name: ("he", "him") for name in _words("Bram Dov Finn Hugo Jory Lars Nils Piet")}
ANIMALS = _words("fox hare goat owl crow badger heron mouse dog cat horse duck")
PLACES = _words(
    "mill market river forest bridge orchard well harbour hill meadow bakery church barn garden inn"
)
PLACES += ["smithy"]
THINGS = _words(
    "lantern basket rope kettle shovel ladder bell coat map key drum boat cart letter blanket hammer"
)
# Food is counted in the unit it comes in: (one, many).
FOODS = {
    "bread": ("loaf of bread", "loaves of bread"),
    "apples": ("apple", "apples"),
    "cheese": ("wheel of cheese", "wheels of cheese"),
    "honey": ("pot of honey", "pots of honey"),
    "plums": ("plum", "plums"),
    "nuts": ("nut", "nuts"),
    "milk": ("jug of milk", "jugs of milk"),
    "pears": ("pear", "pears"),
    "eggs": ("egg", "eggs"),
    "soup": ("bowl of soup", "bowls of soup"),
}
ADJECTIVES = _words(
    "old small red heavy bright quiet muddy green broken warm tall crooked shiny wooden soft strange"
)
TIMES = _words("morning evening afternoon night dawn dusk")
WEATHER = [
    "the rain fell softly",
    "the wind blew from the sea",
    "the sun was warm",
    "a thick fog lay on the fields",
    "snow covered the roofs",
    "the sky was clear",
    "thunder rolled over the hills",
]
SEASONS = _words("spring summer autumn winter")
NUMBERS = _words(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen"
)
NUMBERS += _words("sixteen seventeen eighteen nineteen twenty")
FEELINGS = _words("glad tired worried proud hungry curious sleepy cheerful")
LESSONS = [
    "a kind word costs nothing",
    "slow work is still work",
    "every road leads home at last",
    "a shared meal tastes better",
    "it is wise to ask before taking",
    "a friend in need is a friend indeed",
    "the river does not wait for anyone",
    "small hands can carry large things",
]


def _sentence(text: str) -> str:
    return text[0].upper() + text[1:]


class _Teller:
    """Tells one tale at a time from a seeded ``random.Random``."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def pick(self, items: list[str]) -> str:
        return self.rng.choice(items)

    def two_people(self) -> tuple[str, str]:
        first, second = self.rng.sample(sorted(CHARACTERS), 2)
        return first, second

    def opening(self, hero: str) -> str:
        time, weather = self.pick(TIMES), self.pick(WEATHER)
        season, place = self.pick(SEASONS), self.pick(PLACES)
        return f"One {time} in {season}, {weather}, and {hero} went down to the {place}."

    def errand(self, hero: str, friend: str) -> str:
        she, her = CHARACTERS[hero]
        thing, adj, place = self.pick(THINGS), self.pick(ADJECTIVES), self.pick(PLACES)
        return (
            f"{hero} carried a {adj} {thing}, because {friend} had asked for it. "
            f"At the {place} {she} stopped and looked around, and nobody saw {her}."
        )

    def counting(self, hero: str, friend: str) -> str:
        she, her = CHARACTERS[hero]
        one, many = FOODS[self.pick(sorted(FOODS))]
        have, more = self.rng.randint(1, 10), self.rng.randint(1, 10)
        return (
            f"{hero} had {NUMBERS[have]} {one if have == 1 else many}, and {friend} gave {her} "
            f"{NUMBERS[more]} more, so now {she} had {NUMBERS[have + more]} {many}."
        )

    def dialogue(self, hero: str, friend: str) -> str:
        thing, adj = self.pick(THINGS), self.pick(ADJECTIVES)
        place = self.pick(PLACES)
        feeling = self.pick(FEELINGS)
        she = CHARACTERS[friend][0]
        return (
            f'"Where is the {adj} {thing}?" asked {hero}. '
            f'"It is by the {place}," said {friend}, and {she} was {feeling}.'
        )

    def animal(self, hero: str) -> str:
        she, her = CHARACTERS[hero]
        beast, adj, food = self.pick(ANIMALS), self.pick(ADJECTIVES), self.pick(sorted(FOODS))
        return (
            f"A {adj} {beast} followed {her} along the road. "
            f"{_sentence(she)} gave the {beast} some {food}, and the {beast} was no longer {adj} but glad."
        )

    def trade(self, hero: str, friend: str) -> str:
        her = CHARACTERS[hero][1]
        mine, theirs = self.rng.sample(THINGS, 2)
        feeling = self.pick(FEELINGS)
        return f"{hero} traded {her} {mine} for the {theirs} of {friend}, and both were {feeling}."

    def lesson(self, hero: str) -> str:
        return f"And so {hero} learned that {self.pick(LESSONS)}."

    def ending(self, hero: str, friend: str) -> str:
        she = CHARACTERS[hero][0]
        time = self.pick(TIMES)
        return f"By {time} {hero} was home again, and {she} told {friend} everything that had happened."

    def tale(self, number: int) -> str:
        hero, friend = self.two_people()
        middle = [self.errand, self.counting, self.dialogue, self.trade, self.counting, self.dialogue]
        self.rng.shuffle(middle)
        parts = [self.opening(hero)] + [tell(hero, friend) for tell in middle[: self.rng.randint(2, 4)]]
        if self.rng.random() < 0.5:
            parts.insert(self.rng.randint(1, len(parts)), self.animal(hero))
        if self.rng.random() < 0.3:
            parts.append(self.lesson(hero))
        parts.append(self.ending(hero, friend))
        title = f"Tale {number}: {hero} and the {self.pick(ADJECTIVES)} {self.pick(THINGS)}"
        return f"{title}\n\n" + " ".join(parts) + "\n"


def generate_tales(num_tales: int = 600, seed: int = 1234) -> str:
    """The embedded corpus text: ``num_tales`` tales from a ``random.Random(seed)``."""
    teller = _Teller(random.Random(seed))
    return "\n".join(teller.tale(i + 1) for i in range(num_tales))


if __name__ == "__main__":
    target = Path(__file__).with_name("corpus.txt")
    target.write_text(generate_tales(), encoding="utf-8")
    print(f"wrote {target} ({target.stat().st_size} bytes)")
