"""The verifiable reward: pull the final number out of a response and compare it exactly.

Where the answer is looked for, first match wins:
  1. the first number after the last '####' (the format the prompt asks for),
  2. the first number inside the last `\\boxed{...}` (`\\frac{a}{b}` read as a/b),
  3. the first number after the last "answer is" / "answer:",
  4. the last number anywhere in the text.
A rule whose place holds no number falls through to the next. Numbers are normalised before
comparing: `$` and units dropped, commas between thousands removed ("1,234"; "1,2,3" stays three
numbers), a sentence's trailing '.' ignored, '-' kept as a sign only when it sits right before
the digits and follows no digit or letter ("5-3" is 5 and 3). Comparison is exact rational
arithmetic (`Fraction`): "5.00" == "5", "3.50" == "3.5", "0.5" == "1/2".
"""

from __future__ import annotations

import re
from fractions import Fraction

# A sign only where it cannot be a minus between two operands; optional '$' after the sign;
# digits with comma-grouped thousands or plain; an optional decimal part; an optional "/q".
_NUMBER = (r"(?<![\w.])-?(?:\\?\$\s?)?"
           r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s?/\s?\d+(?:\.\d+)?)?"
           r"|(?<![\w.])-?\.\d+")
NUMBER_RE = re.compile(_NUMBER)
FORMAT_RE = re.compile(r"####\s*(?:" + _NUMBER + ")")
_ANSWER_IS_RE = re.compile(r"answer\s*(?:is|:)", re.IGNORECASE)
_FRAC_RE = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")


def to_fraction(number: str) -> Fraction | None:
    """The exact value of one matched number ("$1,234.50", "- 7", "3/4"), None if it is not one."""
    text = re.sub(r"[\s$,\\]", "", number)
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None


def canonical(value: Fraction) -> str:
    """A fraction written the short way: "5", "-3", "1234.5", or "1/3" when no decimal ends."""
    if value.denominator == 1:
        return str(value.numerator)
    den, twos, fives = value.denominator, 0, 0
    while den % 2 == 0:
        den, twos = den // 2, twos + 1
    while den % 5 == 0:
        den, fives = den // 5, fives + 1
    if den != 1:
        return f"{value.numerator}/{value.denominator}"
    places = max(twos, fives)
    scaled = abs(value.numerator) * 10**places // value.denominator
    digits = str(scaled).rjust(places + 1, "0")
    sign = "-" if value < 0 else ""
    return f"{sign}{digits[:-places]}.{digits[-places:]}".rstrip("0")


def _numbers(text: str) -> list[Fraction]:
    values = (to_fraction(match.group()) for match in NUMBER_RE.finditer(text))
    return [value for value in values if value is not None]


def _last_boxed(text: str) -> str | None:
    """The contents of the last \\boxed{...}, braces balanced."""
    start = text.rfind("\\boxed")
    if start < 0:
        return None
    open_at = text.find("{", start)
    if open_at < 0:
        return None
    depth = 0
    for i in range(open_at, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[open_at + 1:i]
    return None


def _candidates(text: str):
    """The places an answer may sit, most trusted first."""
    if "####" in text:
        yield text.rsplit("####", 1)[1], "first"
    boxed = _last_boxed(text)
    if boxed is not None:
        yield _FRAC_RE.sub(r"\1/\2", boxed), "first"
    answer_is = list(_ANSWER_IS_RE.finditer(text))
    if answer_is:
        yield text[answer_is[-1].end():], "first"
    yield text, "last"


def extract_answer(text: str) -> str | None:
    """The response's final number in canonical form ("1234.5", "-7", "1/3"), or None."""
    for place, which in _candidates(text):
        numbers = _numbers(place)
        if numbers:
            return canonical(numbers[0] if which == "first" else numbers[-1])
    return None


def parse_target(target: str) -> Fraction:
    value = to_fraction(str(target).strip().rstrip("."))
    if value is None:
        raise ValueError(f"reward: target {target!r} is not a number")
    return value


def reward(text: str, target: str) -> float:
    """1.0 when the extracted answer equals the target exactly, else 0.0."""
    expected = parse_target(target)
    answer = extract_answer(text)
    return 1.0 if answer is not None and Fraction(answer) == expected else 0.0


def has_format(text: str) -> bool:
    """True when the response writes '####' followed by a number."""
    return FORMAT_RE.search(text) is not None
