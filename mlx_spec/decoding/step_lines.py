"""Lines through a batch size's measured step times, for the draft lengths not timed yet
(draft_lengths.py): how a step's time grows with its positions."""

PER_GUESS = 0.25  # the cost model's prior: a guess adds a quarter of a plain position


def fit(known):
    """fit_line through (positions, seconds), held below the shortest timed length to at least
    the prior's slope from it."""
    shortest, its_time = known[0]
    return fit_line(known, lambda p: its_time * (1 + PER_GUESS * (p - 1)) / (1 + PER_GUESS * (shortest - 1)))


def fit_line(known, prior):
    """A least-squares line through (length, seconds) points (two or more), never below zero,
    and below the shortest length never below `prior`."""
    shortest, n = known[0][0], len(known)
    mean_x = sum(k for k, _ in known) / n
    mean_t = sum(t for _, t in known) / n
    spread = sum((k - mean_x) ** 2 for k, _ in known)
    slope = sum((k - mean_x) * (t - mean_t) for k, t in known) / spread
    return lambda x: max(mean_t + slope * (x - mean_x), prior(x) if x < shortest else 1e-6)
