"""envforge's verifiers env under the dotless module name `vf-eval` resolves plugins by.

    PYTHONPATH=examples vf-eval envforge_verifiers --env.taskset.env-dirs '["envs/car_rental"]' \\
        --model NAME --client.base-url http://127.0.0.1:8000/v1 --client.api-key-var OPENAI_API_KEY

verifiers imports a taskset by its id (`envforge_verifiers`) and takes the `Taskset`, `Env` and
`Harness` subclasses the module exports; they are `envforge.integrations.verifiers`'s
(docs/integrations.md#verifiers).
"""

from envforge.integrations.verifiers import EnvforgeEnv, EnvforgeHarness, EnvforgeTaskset

__all__ = ["EnvforgeEnv", "EnvforgeHarness", "EnvforgeTaskset"]
