"""The reward: answer extraction on the cases that break naive parsers, exact comparison."""

from __future__ import annotations

import pytest

from ratchet.data.reward import canonical, extract_answer, has_format, parse_target, reward


@pytest.mark.parametrize("text, expected", [
    # the '####' format, and what may follow it
    ("#### 72", "72"),
    ("####72", "72"),
    ("Natalia sold 48/2 = <<48/2=24>>24 clips.\n#### 72", "72"),
    ("#### 1,234", "1234"),
    ("#### $1,234.50", "1234.5"),
    ("#### -7", "-7"),
    ("#### 5.00", "5"),
    ("#### 18 apples", "18"),
    ("#### 18.", "18"),
    ("#### 0.5", "0.5"),
    # several '####': the last one counts
    ("#### 5\nwait, I made a mistake\n#### 7", "7"),
    ("first try #### 12, second try #### 15 dollars", "15"),
    # numbers in the reasoning do not beat the marked answer
    ("3 + 4 = 7 and 7 * 2 = 14, so #### 14\nDouble-check: 100 pages.", "14"),
    # '####' with no number after it falls through to the next rule
    ("The total is 9 ####", "9"),
    # \boxed
    ("So the answer is \\boxed{42}.", "42"),
    ("\\boxed{1,000}", "1000"),
    ("\\boxed{\\$12.50}", "12.5"),
    ("\\boxed{\\frac{1}{2}}", "0.5"),
    ("\\boxed{\\dfrac{2}{3}}", "2/3"),
    ("first \\boxed{3} then \\boxed{4}", "4"),
    ("We get 10 apples, \\boxed{12}, and 3 left over", "12"),
    # "answer is"
    ("The answer is 18.", "18"),
    ("The final answer is: $1,600", "1600"),
    ("Answer: -3", "-3"),
    ("I computed 5 and 6, and the answer is 11, checked with 2 methods", "11"),
    # the last number
    ("She has 3 apples and buys 4 more, 7 in total.", "7"),
    ("It costs $2,500.", "2500"),
    ("It is 3.50", "3.5"),
    ("x = -7", "-7"),
    ("5-3", "3"),  # a minus between numbers is not a sign
    ("3 - 7", "7"),  # a detached minus is not a sign either
    ("1,2,3", "3"),  # a list, not thousands
    ("50%", "50"),
    ("7", "7"),  # the synthetic task's whole response
    ("+7", "7"),
    ("37", "37"),
    ("about .5 of it", "0.5"),
    ("1/3 of them", "1/3"),
    # no number at all
    ("no number here", None),
    ("", None),
    ("####", None),
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize("text, target, expected", [
    ("#### 1,234", "1234", 1.0),
    ("#### 1234", "1,234", 1.0),
    ("#### $1,234.50", "1234.5", 1.0),
    ("The answer is 3.50", "3.5", 1.0),
    ("#### 5.00", "5", 1.0),
    ("#### -7", "-7", 1.0),
    ("#### 7", "-7", 0.0),
    ("#### -7", "7", 0.0),
    ("\\boxed{42}", "42", 1.0),
    ("The answer is 18.", "18", 1.0),
    ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("no number", "5", 0.0),
    ("", "0", 0.0),
    ("#### 5\n#### 7", "5", 0.0),
    ("#### 5\n#### 7", "7", 1.0),
    ("I think 72 but #### 73", "72", 0.0),
    ("37", "7", 0.0),
    ("7", "7", 1.0),
    ("7.", "7", 1.0),
    ("#### 1000000", "1,000,000", 1.0),
    ("#### 0.1", "0.10", 1.0),
    ("#### 3.14159", "3.1416", 0.0),
])
def test_reward(text, target, expected):
    assert reward(text, target) == expected


def test_reward_refuses_a_target_that_is_not_a_number():
    with pytest.raises(ValueError, match="target 'abc' is not a number"):
        reward("#### 5", "abc")


@pytest.mark.parametrize("text, expected", [
    ("#### 42", True),
    ("reasoning\n####  -3.5", True),
    ("#### $1,234", True),
    ("####", False),
    ("#### forty-two", False),
    ("The answer is 42", False),
    ("\\boxed{42}", False),
    ("### 42", False),
])
def test_has_format(text, expected):
    assert has_format(text) is expected


def test_canonical_and_parse_target():
    assert [canonical(parse_target(t)) for t in ("5.00", "-0.50", "1,234.500", "10", "2/4")] == \
        ["5", "-0.5", "1234.5", "10", "0.5"]
    assert canonical(parse_target("1/3")) == "1/3"
    assert canonical(parse_target("-0.125")) == "-0.125"
