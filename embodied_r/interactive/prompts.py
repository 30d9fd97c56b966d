"""What the agent is told: this project's texts in the original's structure, or the original's (``ReasonerTexts``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

FEEDBACK = "<|feedback|>"
IMAGE = "<image>"

SYSTEM = ("You are a household robot in a room. Carry out the person's instruction by choosing one action "
          "at each step from the available actions, each explained below.")

ACTIONS = (
    '"navigate to <object>": go to the object.\n'
    '"pickup <object>": pick the object up.\n'
    '"put <object>": place what you hold into or onto the object.\n'
    '"toggle <object>": switch the object on or off.\n'
    '"open <object>": open the object (a container) to see inside.\n'
    '"close <object>": close the object.\n'
    '"observe": look to your left, behind you and to your right.\n'
    '"move forward": step forward to see more closely.\n'
    '"end": say this once the task is done.'
)

FORMAT = ("Give exactly one action in the form <DecisionMaking>your action</DecisionMaking>, "
          "for example <DecisionMaking>observe</DecisionMaking>.")

THINK = "Think step by step first, then choose your next action from the available actions."


def first_turn(task: str, n_images: int = 1) -> str:
    return (IMAGE * n_images + "This is the view in front of you. Choose an action from the available actions "
            f"and name its object.\nTask: \"{task}\"\nAvailable actions:\n{ACTIONS}\n"
            f"You may think, plan and reflect before deciding.\n{FORMAT}")


def after_action(action: str, n_images: int = 1) -> str:
    hint = '\nTo look at larger objects nearby, use "navigate to <object>".' if action == "move forward" else ""
    return IMAGE * n_images + f'You did "{action}"; the image above is what you see now.{hint}\n{THINK}\n{FORMAT}'


def after_failure(action: str, reason: str, unmatched: bool = False) -> str:
    if unmatched:
        why = (f'"{action}" is not possible: the object named does not match anything in this room. '
               "Act on another object, or navigate to another object first.")
    else:
        why = (f'"{action}" is not possible now: {reason} You may "move forward" to get closer, or '
               '"navigate to <object>" to reach a larger object nearby.')
    return f"{FEEDBACK}{why}\n{THINK}\n{FORMAT}"


INVALID = f"That reply holds no available action.\n{THINK}\n{FORMAT}"


class ReasonerTexts(BaseModel):
    """The original's ``str.format`` templates: the feedback's fields are ``{action}`` (the verb),
    ``{item}`` (the matched object) and ``{raw_action}`` (as written)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    system: str
    first_turn: str
    after_action: str
    after_move_forward: str
    after_error: str
    invalid_action: str
    feedback_navigate_unmatched: str
    feedback_navigate_unreachable: str
    feedback_interact_unmatched: str
    feedback_interact_unavailable: str
    source: str  # official@<commit>


def official_feedback(texts: ReasonerTexts, verb: str, obj: str | None, raw: str, unmatched: bool) -> str:
    """The original's turn after an illegal action, by the verb and whether the object matched."""
    if verb == "navigate to":
        feedback = texts.feedback_navigate_unmatched if unmatched else texts.feedback_navigate_unreachable
    else:
        feedback = texts.feedback_interact_unmatched if unmatched else texts.feedback_interact_unavailable
    return feedback.format(action=verb, item=obj or "", raw_action=raw) + texts.after_error
