"""Hidden tests: the course-assignment grader runs them, a student tree leaves them out.

Tests here carry ``@pytest.mark.task`` like the visible ones, and run in the normal suite
(tests/run.py collects this folder too). They live here because their oracle would hand a student
a solution: ps_replay.py re-implements the server's update and the Downpour worker's schedule
(tasks 5.1 and 5.3), test_hogwild_serial.py's serial loop is Hogwild!'s update (task 5.5).
``tutorials/assignments/tasks.toml`` ([generator] remove) leaves the folder out of student trees.
"""
