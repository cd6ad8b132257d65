"""Tools of the persona family (the inner model calls these; identical in training and eval).

The world is a fixed, hash-defined directory of people ``p1`` .. ``p4999``: every person has four
attributes (city, job, hobby, pet) and ten relations, each pointing at another person. Nothing is
stored: a field's value is a pure function of the person id and the field name.
"""

from __future__ import annotations

import hashlib
import re

N_PEOPLE = 4999
CITIES = ("Oslo", "Lima", "Cairo", "Delhi", "Paris", "Rome", "Tokyo", "Seoul", "Quito", "Dakar",
          "Accra", "Hanoi", "Dublin", "Madrid", "Vienna", "Prague", "Berlin", "Athens", "Lisbon", "Nairobi",
          "Manila", "Bogota", "Havana", "Riga", "Sofia", "Tunis", "Perth", "Osaka", "Zurich", "Austin")
JOBS = ("nurse", "pilot", "chef", "baker", "lawyer", "farmer", "dentist", "plumber", "teacher", "painter",
        "actor", "barber", "tailor", "miner", "judge", "poet", "sailor", "coder", "vet", "welder")
HOBBIES = ("chess", "golf", "tennis", "hiking", "fishing", "karate", "surfing", "cycling", "rowing", "skiing",
           "poker", "yoga", "boxing", "dancing", "archery", "knitting", "pottery", "baking", "diving", "juggling")
PETS = ("cat", "dog", "parrot", "rabbit", "hamster", "turtle", "goldfish", "horse", "ferret", "lizard",
        "snake", "pony", "goat", "canary", "tortoise")
ATTRIBUTES = {"city": CITIES, "job": JOBS, "hobby": HOBBIES, "pet": PETS}
RELATIONS = ("manager", "sister", "brother", "friend", "mentor", "neighbor", "cousin", "partner", "coach",
             "doctor")
FIELDS = tuple(ATTRIBUTES) + RELATIONS

_ID = re.compile(r"p([1-9]\d{0,3})")


def _h(*parts: str) -> int:
    return int(hashlib.sha256(":".join(("persona",) + parts).encode("utf-8")).hexdigest()[:12], 16)


def _value(pid: int, field: str) -> str:
    if field in ATTRIBUTES:
        vocab = ATTRIBUTES[field]
        return vocab[_h(f"p{pid}", field) % len(vocab)]
    other = 1 + _h(f"p{pid}", field) % N_PEOPLE
    if other == pid:
        other = other % N_PEOPLE + 1
    return f"p{other}"


def lookup(person: str, field: str) -> str:
    """Look up one field of a person's record in the people directory.

    Args:
        person: A person id from p1 to p4999, e.g. "p17".
        field: An attribute (city, job, hobby, pet) or a relation (manager, sister, brother, friend, mentor, neighbor, cousin, partner, coach, doctor); a relation gives another person id.

    Returns:
        The value, e.g. "Oslo" or "p203", or a message starting with "error:".
    """
    pid = str(person).strip().lower()
    m = _ID.fullmatch(pid)
    if m is None or int(m.group(1)) > N_PEOPLE:
        return f"error: unknown person {str(person)[:20]!r}; ids are p1..p{N_PEOPLE}"
    key = str(field).strip().lower()
    if key not in FIELDS:
        return f"error: unknown field {str(field)[:20]!r}; fields: {', '.join(FIELDS)}"
    return _value(int(m.group(1)), key)


TOOLS = [lookup]
