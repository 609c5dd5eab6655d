"""Lines through a batch size's measured step times, for the draft lengths not timed yet
(draft_lengths.py): how a step's time grows with its positions. Pure functions of the cost
model's table, which draft_lengths.py owns."""

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


def timed_at(seconds: dict, batch: int) -> list:
    """(positions, seconds) of the lengths timed at this batch size, shortest first; `seconds`
    is the cost model's table, (rows, positions) -> a step's time."""
    return sorted((positions, t) for (rows, positions), t in seconds.items() if rows == batch)


def line(seconds: dict, batch: int):
    """positions -> a step's time at this batch size, for lengths not timed yet: a line through
    this size's timed lengths; with fewer than two, the shape of the nearest size's line (how a
    step's cost grows with its positions), through this size's one time if it has one; the
    prior where nothing is known."""
    known = timed_at(seconds, batch)
    if len(known) >= 2:
        return fit(known)
    others = [b for b in {rows for rows, _ in seconds} if b != batch and len(timed_at(seconds, b)) >= 2]
    if not others:
        shape = lambda positions: 1 + PER_GUESS * (positions - 1)  # noqa: E731
    else:
        shape = fit(timed_at(seconds, min(others, key=lambda b: abs(b - batch))))
    if not known:
        return shape
    positions, its_time = known[0]
    return lambda p: its_time * shape(p) / shape(positions)
