"""Profiles: the TOML file that says what to benchmark, validated once where it enters.

A profile names a target model, the drafts to try against it, the sweep of gamma /
temperature / top_p points, the workload (prompts) and how often to repeat each point.
Every problem is reported as a `ProfileError` whose message is one line naming the file,
the key and what to do, e.g. `profiles/x.toml: sweep.gamma[1]: must be an integer >= 1 (got 0)`.

Modules, one per TOML table: ``target``, ``drafts``, ``sweep``, ``load``, ``slo``, ``workload``, ``run``,
``server``, ``capacity``, ``cost``; ``schema`` (the whole profile and the rules across tables), ``files`` (read,
write, override), ``fields`` (the base model, the error, shared value types), ``validation`` (one-line errors),
``references`` (model and prompt-set references).
"""

from specbench.profile.drafts import DraftSpec
from specbench.profile.fields import ProfileError
from specbench.profile.files import DEFAULT_PROFILE, dump_profile, load_profile, with_overrides
from specbench.profile.schema import Profile, profile_from_dict
from specbench.profile.workload import WorkloadSpec

__all__ = ["DEFAULT_PROFILE", "DraftSpec", "Profile", "ProfileError", "WorkloadSpec", "dump_profile", "load_profile",
           "profile_from_dict", "with_overrides"]
