"""Continue: an answer cut short (the length cap, a cap while Sluice sheds load, or stopped
because it looped) goes on in a new request.

The new request reads the conversation as it is, ending with the cut answer, plus one
instruction for this request only: carry on from where the answer stopped. The continuation is
stored as an answer of its own, right after the one it continues (the page shows it as the
next bubble). The instruction comes after the history, so a worker that still holds the
conversation's KV cache reads only the instruction.
"""

from __future__ import annotations

from apps.accounts.models import User
from apps.chat.models import Conversation, Message
from apps.chat.submission import (
    ConversationBusy,
    Submitted,
    ensure_conversation_free,
    request_submit,
)

CONTINUE_INSTRUCTION = (
    "Your previous answer was cut off. Continue it from exactly where it stopped, without "
    "repeating what you already wrote and without starting over."
)


def answer_continue(*, user: User, conversation: Conversation) -> Submitted:
    """A new request that continues the conversation's last answer. Raises ConversationBusy
    when an answer is still generating or there is no answer to continue."""
    ensure_conversation_free(conversation=conversation)
    last = conversation.messages.order_by("-created", "-id").first()
    if last is None or last.role != Message.Role.ASSISTANT or not last.text.strip():
        raise ConversationBusy("There is no answer to continue.")
    if last.status != Message.Status.DONE:  # only finished turns are in the prompt's history
        raise ConversationBusy("Only an answer that ended can be continued; regenerate it.")
    return request_submit(
        user=user, conversation=conversation, text=None, instruction=CONTINUE_INSTRUCTION
    )
