"""The policy's prompt texts, which the convert stage fills in: the system prompt, the user
turn's template and the answer-format instructions (the demo's tiny reasoner keeps each fixed
text as one token)."""

# This project's wording of the paper's texts; the official ones are never shipped (`embodied-r
# prompts import-official` reads them from the user's clone). Kept of the official shape: the
# four tags and the "User: . Assistant:" tail of its system prompt (docs/fidelity.md).
DEFAULT_SYSTEM = (
    "The User asks a question and the Assistant answers it. The Assistant reasons about the "
    "question first and answers after: the reasoning goes inside <think> </think> and the answer "
    "inside <answer> </answer>, as in <think> the reasoning </think> \n<answer> the answer "
    "</answer>. The answer must follow from the reasoning and agree with it. "
    "User: . Assistant:"
)

DEFAULT_VIDEO_PREAMBLE = (
    "The video is given as text, one description per key frame. Frame 0 shows what the agent "
    "sees where it starts; each later frame is what it sees after moving on, and the last "
    "frame is what it sees now."
)

DEFAULT_TEMPLATE = (
    "You are the agent. Below are text descriptions of your egocentric video, oldest first.\n"
    "Video content:\n<\n{preamble}\n{video_text}\n>\n"
    "Question: {question}\n"
    "{instruction}"
)

# The official user turn has none: the paper recipes set both to "".
DEFAULT_CHOICE_INSTRUCTION = (
    "Think about the question inside <think> </think>, then give only the letter of the "
    "one correct option inside <answer> </answer>."
)
DEFAULT_NUMBER_INSTRUCTION = (
    "Think about the question inside <think> </think>, then give only the number inside "
    "<answer> </answer>."
)
