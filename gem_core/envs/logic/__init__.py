"""Logic envs: RuleTaker-style reasoning over facts and rules (``logic:RuleTaker-d0`` ... ``-d5``)."""
