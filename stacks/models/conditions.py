"""The status words: phases, condition types and reasons, in one place.

Everything that writes a Proxy's status (the control loop, the health engine, the Kubernetes source to come,
pools) and every error of the automation layer takes its words from here, so a reason never changes spelling
between a condition, an event, a log line and a metric label.
"""

from __future__ import annotations


class Phase:
    """A Proxy's phase, derived from its conditions (see `phase_of`)."""

    PENDING = "Pending"  # nothing applied yet
    PROVISIONING = "Provisioning"  # nothing applied yet, and a run of its stack is in progress
    READY = "Ready"  # applied as declared, and healthy (or not probed yet)
    DEGRADED = "Degraded"  # applied as declared, failing its probes
    HELD = "Held"  # its last applied version runs; the declared one could not be used (Held condition)
    FAILED = "Failed"  # nothing of it runs and the last attempt failed
    STALLED = "Stalled"  # failed several times in a row; waits for a change of its input
    DELETING = "Deleting"  # deletion declared; its resources are being removed (or forgotten)


class ConditionType:
    READY = "Ready"  # derived: provisioned as declared and not failing probes (see `ready_of`)
    PROVISIONED = "Provisioned"  # its resources exist in a stack
    HEALTHY = "Healthy"  # its probes pass
    STALLED = "Stalled"  # its stack stopped retrying
    HELD = "Held"  # what runs is the last applied version, not the declared one


class Reason:
    """Machine-readable reasons of conditions, events, errors and metric labels."""

    # progress
    PROVISIONED = "Provisioned"
    RECONCILED = "Reconciled"
    INPUT_CHANGED = "InputChanged"  # Stalled=False: a refused input was changed, it is tried again
    DELETING = "Deleting"
    RELEASED = "Released"
    FORGOTTEN = "Forgotten"
    AS_DECLARED = "AsDeclared"  # Held=False: the declared version is the one applied
    # health
    PROBE_SUCCEEDED = "ProbeSucceeded"
    PROBE_FAILED = "ProbeFailed"
    DRIFT_DETECTED = "DriftDetected"
    RESOURCES_MISSING = "ResourcesMissing"
    # why a declared version is held back (the last applied one keeps running)
    INVALID_SPEC = "InvalidSpec"
    MANIFEST_UNREADABLE = "ManifestUnreadable"
    NOT_IN_COMPLETE_READ = "NotDeclared"  # absent from a read that was not complete: not a deletion
    DELETION_HELD = "DeletionHeld"  # the deletion budget stopped a large removal
    NAME_COLLISION = "NameCollision"
    CREDENTIALS_MISSING = "CredentialsMissing"
    PROVIDER_MISSING = "ProviderMissing"
    STACK_NOT_OWNED = "StackNotOwned"
    PAUSED = "Paused"  # crawl.example.com/paused: changes wait
    NOT_FOUND = "ProxyNotFound"  # applied, but no object of that name (and no deletion seen)
    # errors of the automation layer (automation.errors)
    ERROR = "Error"
    INVALID_INPUT = "InvalidInput"
    UNKNOWN_PROVIDER = "UnknownProvider"
    CREDENTIALS_REJECTED = "CredentialsRejected"
    MISSING_KVM_HOST = "MissingKvmHost"
    TRANSIENT = "TransientError"
    NETWORK = "NetworkError"
    QUOTA = "QuotaExceeded"
    STACK_LOCKED = "StackLocked"
    UNEXPECTED = "UnexpectedError"
    STACK_FAILED = "StackFailed"
    STALLED = "Stalled"
    # the derived Ready condition
    READY = "Ready"
    PROVISIONING = "Provisioning"
    NOT_PROVISIONED = "NotProvisioned"


class Operation:
    """`lastOperation.type` and `lastOperation.result` words."""

    UP = "up"
    DESTROY = "destroy"
    REFRESH = "refresh"
    FORGET = "forget"
    IN_PROGRESS = "in-progress"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


def phase_of(conditions: dict[str, str], *, running: bool = False, deleting: bool = False) -> str:
    """The phase from condition statuses ({type: "True"|"False"|"Unknown"}), whether a run of its stack is
    in progress and whether its deletion is declared. Deleting wins: a stalled deletion still says what is
    under way (the Stalled condition says why it is stuck)."""
    if deleting:
        return Phase.DELETING
    if conditions.get(ConditionType.STALLED) == "True":
        return Phase.STALLED
    if conditions.get(ConditionType.PROVISIONED) == "True":
        if conditions.get(ConditionType.HELD) == "True":
            return Phase.HELD
        return Phase.READY if conditions.get(ConditionType.HEALTHY) != "False" else Phase.DEGRADED
    if running:
        return Phase.PROVISIONING  # nothing applied yet (or its last attempt failed) and a run is under way
    if conditions.get(ConditionType.PROVISIONED) == "False":
        return Phase.FAILED
    return Phase.PENDING


def ready_of(
    conditions: dict[str, str], *, running: bool = False, deleting: bool = False
) -> tuple[bool, str]:
    """The derived Ready condition: (status, reason). Ready = Provisioned, not Held, not failing probes, not
    stalled and not being deleted; otherwise the reason names the first thing in the way."""
    if deleting:
        return False, Reason.DELETING
    if conditions.get(ConditionType.STALLED) == "True":
        return False, Reason.STALLED
    if conditions.get(ConditionType.PROVISIONED) != "True":
        return False, Reason.PROVISIONING if running else Reason.NOT_PROVISIONED
    if conditions.get(ConditionType.HELD) == "True":
        return False, ConditionType.HELD
    if conditions.get(ConditionType.HEALTHY) == "False":
        return False, Reason.PROBE_FAILED
    return True, Reason.READY
