"""The status words: phases, condition types and reasons, in one place.

Everything that writes a Proxy's status (the control loop, the health engine, the Kubernetes source to come,
pools) and every error of the automation layer takes its words from here, so a reason never changes spelling
between a condition, an event, a log line and a metric label.
"""

from __future__ import annotations


class Phase:
    """A Proxy's phase, derived from its conditions (see `phase_of`)."""

    PENDING = "Pending"  # nothing applied yet
    READY = "Ready"  # applied as declared, and healthy (or not probed yet)
    DEGRADED = "Degraded"  # applied as declared, failing its probes
    HELD = "Held"  # its last applied version runs; the declared one could not be used (Held condition)
    FAILED = "Failed"  # nothing of it runs and the last attempt failed
    STALLED = "Stalled"  # failed several times in a row; waits for a change of its input


class ConditionType:
    PROVISIONED = "Provisioned"  # its resources exist in a stack
    HEALTHY = "Healthy"  # its probes pass
    STALLED = "Stalled"  # its stack stopped retrying
    HELD = "Held"  # what runs is the last applied version, not the declared one


class Reason:
    """Machine-readable reasons of conditions, events, errors and metric labels."""

    # progress
    PROVISIONED = "Provisioned"
    RECONCILED = "Reconciled"
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


def phase_of(conditions: dict[str, str]) -> str:
    """The phase from condition statuses ({type: "True"|"False"|"Unknown"})."""
    if conditions.get(ConditionType.STALLED) == "True":
        return Phase.STALLED
    if conditions.get(ConditionType.PROVISIONED) == "False":
        return Phase.FAILED
    if conditions.get(ConditionType.PROVISIONED) == "True":
        if conditions.get(ConditionType.HELD) == "True":
            return Phase.HELD
        return Phase.READY if conditions.get(ConditionType.HEALTHY) != "False" else Phase.DEGRADED
    return Phase.PENDING
