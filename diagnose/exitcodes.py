"""Exit codes, decided in one place (documented in the README and in ``diagnose --help``)."""
OK = 0  # healthy, or no finding at or above --fail-on
FINDINGS = 1  # a failure (finding at or above --fail-on) was found
USAGE = 2  # bad usage or unreadable input / config
INTERNAL = 3  # a bug in diagnose (please report it)
FIXED_HEALTHY = 4  # --fix --relaunch: fixed, and the relaunched run is healthy
RELAUNCH_FAILED = 5  # --fix --relaunch: relaunched and failed again (or attempts exhausted)
NO_FIX = 6  # --fix: no fix is known for this root cause
UNSAFE_REFUSED = 7  # --fix: the fix is unsafe and --unsafe-fixes was not given

HELP = """Exit codes: 0 healthy / nothing at or above --fail-on; 1 failure found; 2 usage or input
error; 3 internal error; 4 fixed and the relaunched run is healthy; 5 relaunched and failed
again; 6 no fix known; 7 unsafe fix refused (use --unsafe-fixes)."""

# check never fixes or relaunches: only the codes it can return
HELP_CHECK = """Exit codes: 0 the config passes (nothing at or above --fail-on); 1 a rule fires at or above
--fail-on (or the memory estimate does not fit); 2 usage error or unreadable config; 3 internal error."""
