"""Every error mlx-spec raises on purpose, in one place, under one base class.

A message always names what is wrong and, where it can, what to do instead: the command line
prints it as one line, the server answers it with a 4xx status. Anything else that escapes is a
bug of ours.
"""


class MlxSpecError(Exception):
    """The base of mlx-spec's own errors."""


class SettingsError(MlxSpecError, ValueError):
    """Settings, prompts or inputs that cannot be honoured (the message says which and why)."""


class ContextError(SettingsError):
    """The prompt and the tokens asked for do not fit the model's positions."""

    def __init__(self, prompt_tokens: int, requested: int, context: int):
        self.prompt_tokens, self.requested, self.context = prompt_tokens, requested, context
        if prompt_tokens < context:  # (the prompt fits: the answer asked for does not)
            super().__init__(f"{prompt_tokens} prompt tokens plus {requested} to generate exceed the model's "
                             f"{context} positions: at most {context - prompt_tokens} can be generated")
        else:
            super().__init__(f"prompt too long: {prompt_tokens} tokens plus {requested} to generate exceed the "
                             f"model's {context} positions")


class MediaError(SettingsError):
    """An image or audio input that cannot be used; the message says why."""


class LoadError(MlxSpecError):
    """A checkpoint could not be used; the message names the path and the problem."""


class AudioWeightsError(LoadError):
    """The checkpoint's audio tower weights do not fit its audio config; the message names them."""


class PromptStopped(MlxSpecError):
    """The caller stopped a prompt while it went through the target (a request cancelled):
    the sequence holds the part that went through, consistent, to be resumed or dropped."""

    def __init__(self, processed: int):
        self.processed = processed
        super().__init__(f"the prompt was stopped after {processed} of its tokens went through")


class GroupError(MlxSpecError):
    """A group of processes (mlx.launch) that cannot start or has lost a rank: the run ends
    with this rather than waiting on a rank that will never answer."""
