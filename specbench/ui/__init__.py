"""The terminal: live progress and end-of-command summaries (with specbench.report.terminal, the only importers of
rich).

Modules: ``console`` (a console sized for logs, error lines), ``run`` (`specbench run`: progress, the run summary,
capacity; the model and dataset lists), ``tune`` (`specbench tune`: progress, the recommendation), ``heads``
(`specbench heads train`: progress, the head's report), ``lines`` (progress as plain lines where the console is not
a terminal: job logs, pipes).
"""
