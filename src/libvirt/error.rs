//! What a libvirt call can fail with, and how the launcher reads libvirt's own error numbers.

use virt::error::ErrorNumber;

use super::events;

/// The most of a guest agent's answer we take: the agent is the guest's, its answers untrusted;
/// the largest real one (`guest-get-fsinfo` of a guest with many mounts) is some tens of KB.
pub(crate) const MAX_AGENT_ANSWER: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum LibvirtError {
    #[error("cannot connect to libvirt at {uri}")]
    Connect {
        uri: String,
        #[source]
        source: virt::error::Error,
    },
    #[error(transparent)]
    Events(#[from] events::EventError),
    #[error("libvirt {call} on domain {domain} failed")]
    Call {
        call: &'static str,
        domain: String,
        #[source]
        source: virt::error::Error,
    },
    #[error("domain {domain} does not exist")]
    NoDomain { domain: String },
    #[error("cannot publish {rule} of domain {domain}: {message}")]
    Publish {
        domain: String,
        rule: String,
        message: String,
    },
    #[error(
        "the guest agent of domain {domain} answered {len} bytes, over the limit of {}",
        MAX_AGENT_ANSWER
    )]
    AgentAnswerTooLarge { domain: String, len: usize },
    #[error("cannot read the live XML of domain {domain}")]
    LiveXml {
        domain: String,
        #[source]
        source: crate::domain::LiveXmlError,
    },
}

/// libvirt's error number of `e` is `n`.
pub(super) fn code_is(e: &virt::error::Error, n: ErrorNumber) -> bool {
    e.code() == virt::enumutil::Enum::Known(n)
}

impl LibvirtError {
    /// libvirt found no such device in the domain (`VIR_ERR_DEVICE_MISSING`): for a detach, the
    /// device is gone already.
    pub(crate) fn is_device_missing(&self) -> bool {
        matches!(self, LibvirtError::Call { source, .. } if code_is(source, ErrorNumber::DeviceMissing))
    }

    /// libvirt gave up waiting (`VIR_ERR_OPERATION_TIMEOUT`): for a call that takes the domain's
    /// job (an attach, a detach), another job held it past libvirt's 30 s wait.
    pub(crate) fn is_operation_timeout(&self) -> bool {
        matches!(self, LibvirtError::Call { source, .. } if code_is(source, ErrorNumber::OperationTimeout))
    }

    /// libvirt's own message, for status reports that show one line.
    pub(crate) fn libvirt_message(&self) -> String {
        match self {
            LibvirtError::Connect { source, .. } | LibvirtError::Call { source, .. } => {
                source.message().to_string()
            }
            other => other.to_string(),
        }
    }

    /// The failure is about reaching libvirt, not about the request.
    pub(crate) fn is_unavailable(&self) -> bool {
        match self {
            LibvirtError::Connect { .. } => true,
            LibvirtError::Call { source, .. } => matches!(
                source.code(),
                virt::enumutil::Enum::Known(
                    ErrorNumber::SystemError | ErrorNumber::Rpc | ErrorNumber::NoConnect
                )
            ),
            _ => false,
        }
    }
}
