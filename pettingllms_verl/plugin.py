"""verl plugin entry point (``[project.entry-points."verl.plugins"]``).

verl imports this module in every process that imports verl (driver, TaskRunner, trainer
workers, agent-loop workers) and swallows any error at debug level, so ``register()`` checks its
own work and fails loudly, on stderr, if anything is missing.
"""

from pettingllms_verl.registration import register

register()
