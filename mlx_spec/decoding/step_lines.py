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
    shortest = known[0][0]
    mean_x, mean_t, slope = least_squares(known)
    return lambda x: max(mean_t + slope * (x - mean_x), prior(x) if x < shortest else 1e-6)


def least_squares(points):
    """(mean x, mean y, slope) of the least-squares line through (x, y) points, two x's or more."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    return mean_x, mean_y, sum((x - mean_x) * (y - mean_y) for x, y in points) / spread


def timed_at(seconds: dict, batch: int) -> list:
    """(positions, seconds) of the lengths timed at this batch size, shortest first; `seconds`
    is the cost model's table, (rows, positions) -> a step's time."""
    return sorted((positions, t) for (rows, positions), t in seconds.items() if rows == batch)


def line(seconds: dict, batch: int):
    """positions -> a step's time at this batch size, for lengths not timed yet: a line through
    this size's timed lengths; with fewer than two, the shape of the nearest size's line (how a
    step's cost grows with its positions), through this size's one time if it has one, and where
    two sizes or more have lines, never below what their slopes say a position adds at this size;
    the prior where nothing is known."""
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
    borrowed = lambda p: its_time * shape(p) / shape(positions)  # noqa: E731
    if len(others) < 2:
        return borrowed
    # The nearest size's shape misses that what a position adds grows with the rows: every row's
    # guesses are verified, and on a compute-bound device (this project's CPU) drafted, row by
    # row: borrowed from a size of fewer rows, whose steps are more of fixed cost, the shape put
    # 6 rows' step of 3 positions at 42 ms; it took 57. So the sizes' own slopes, on a line over
    # the rows, price a position too, and the dearer of the two counts: a length priced too cheap
    # is drafted at the whole batch's cost, one priced too dear loses only what it would keep.
    per_position = across_sizes(seconds, others, batch)
    return lambda p: max(borrowed(p), its_time + per_position * (p - positions))


def across_sizes(seconds: dict, sizes, batch: int) -> float:
    """What a position adds to a step of `batch` rows: a line over the rows through the slopes
    of these sizes' lines (each size timed at two lengths or more), never below zero."""
    slopes = [(b, least_squares(timed_at(seconds, b))[2]) for b in sizes]
    mean_b, mean_slope, trend = least_squares(slopes)
    return max(0.0, mean_slope + trend * (batch - mean_b))
