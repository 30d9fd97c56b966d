"""The policy's prompt texts: the system prompt, the user turn's template and the
answer-format instructions. The convert stage (``records``) fills them in; the demo's tiny
reasoner (``embodied_r.demo.tiny_reasoner``) keeps each fixed text as one token.
"""

# The official system prompt word for word, as its evaluation script writes it
# (infer/batch_inference.py), tail "User: . Assistant:" included, so that a policy trained
# here sees what the published one saw. The training scripts pass the same text through
# bash, where "\n" stays two characters (backslash, n); here it is a newline, as at evaluation.
DEFAULT_SYSTEM = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant "
    "solves it. The assistant first thinks about the reasoning process in the mind and then "
    "provides the user with the answer. The reasoning process and answer are enclosed within "
    "<think> </think> and <answer> </answer> tags, respectively, i.e., <think> reasoning "
    "process here </think> \n<answer> answer here </answer>. Ensure that your answer is "
    "consistent with and directly derived from your thinking process, maintaining logical "
    "coherence between the two sections. User: . Assistant:"
)

DEFAULT_VIDEO_PREAMBLE = (
    "The content of the video will be described in the form of text. The 0th frame is the "
    "initial frame, which includes the scene that the agent observes at the initial position. "
    "The agent keeps moving, thus constantly obtaining new visual observations (frames). The "
    "last frame is the visual observation at the current position."
)

DEFAULT_TEMPLATE = (
    "Please assume the role of an agent. You are given frame-by-frame observations of an "
    "egocentric video, from the past to the present.\n"
    "Video content:\n<\n{preamble}\n{video_text}\n>\n"
    "Question: {question}\n"
    "{instruction}"
)

# This project's answer-format instructions. The official user turn has none; the paper
# recipes set both to "" (then the user turn ends with the question and its options).
DEFAULT_CHOICE_INSTRUCTION = (
    "Think about the question inside <think> </think>, then give only the letter of the "
    "one correct option inside <answer> </answer>."
)
DEFAULT_NUMBER_INSTRUCTION = (
    "Think about the question inside <think> </think>, then give only the number inside "
    "<answer> </answer>."
)
