"""The consistency reference's prompts: a question and the policy's reasoning in, the answer
the reasoning supports out. Apart from the reward's code: the demo's tiny reasoner keeps their
fixed texts as single tokens, and the warm start teaches the same task."""

REFERENCE_SYSTEM = "You are a careful assistant who answers multiple-choice questions."
REFERENCE_TEMPLATE_CHOICE = (
    "This is a multiple-choice question. Based only on the question and the reasoning "
    "below, choose the one option the reasoning supports.\n\n"
    "Question:\n{question}\n\nReasoning:\n{think}\n\n"
    "Answer with the option's letter only, without explanation."
)
REFERENCE_TEMPLATE_NUMBER = (
    "Based only on the question and the reasoning below, give the number the reasoning "
    "arrives at.\n\nQuestion:\n{question}\n\nReasoning:\n{think}\n\n"
    "Answer with the number only, without explanation."
)
