//! What a Redis error means to the sidecar, decided once, by kind.
//!
//! Redis answers with an error code (`WRONGTYPE …`), but a pipeline's or a
//! script's failure carries its commands' codes inside its text, so the few
//! codes the sidecar acts on are also looked for there: here, and nowhere
//! else.

use redis::RedisError;

/// The kinds of Redis error the sidecar treats differently.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// WRONGTYPE: the key holds another type.
    WrongType,
    /// NOGROUP, or Redis 7.0's UNBLOCKED for a reader blocked on a stream
    /// that was deleted (7.2 and Valkey say NOGROUP): the group is gone.
    NoGroup,
    /// `ERR no such key` (XINFO on a missing stream).
    NoSuchKey,
    /// BUSYGROUP: XGROUP CREATE found the group existing.
    BusyGroup,
    /// NOPERM: the ACL user may not run the command or touch the key.
    NoPermission,
    /// No answer in time: the command's outcome is unknown.
    Timeout,
    /// The node is not (or not yet) a primary that serves: `READONLY` (a
    /// write reached a replica), `UNBLOCKED … instance state changed` (a
    /// primary turned replica under a blocked reader), `LOADING` (a node
    /// loading its data set) or `MASTERDOWN` (a replica that lost its
    /// primary). On a single server it starts a switch ([`super::primary`]);
    /// retrying may help.
    NotPrimary,
    /// Reaching Redis failed, or it cannot serve now (loading, failover,
    /// a cluster redirect the client could not follow, refused credentials
    /// while they are being renewed): retry may help.
    Unreachable,
    /// Anything else: about the command, not about reaching Redis.
    Other,
}

/// Classifies `error`.
pub fn fault(error: &RedisError) -> Fault {
    let text = error.to_string();
    let has = |code: &str| error.code() == Some(code) || text.contains(code);
    if has("WRONGTYPE") {
        Fault::WrongType
    } else if has("READONLY")
        || has("MASTERDOWN")
        || has("LOADING")
        || (has("UNBLOCKED") && text.contains("instance state changed"))
    {
        // UNBLOCKED "instance state changed" is a primary turning replica in a
        // failover: the group is fine, the read is retried on the new primary.
        Fault::NotPrimary
    } else if has("NOGROUP") || has("UNBLOCKED") {
        Fault::NoGroup
    } else if text.contains("no such key") {
        Fault::NoSuchKey
    } else if has("BUSYGROUP") {
        Fault::BusyGroup
    } else if has("NOPERM") {
        Fault::NoPermission
    } else if error.is_timeout() {
        Fault::Timeout
    } else if error.is_io_error()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        // A MOVED or ASK that reaches us is one the cluster client could not
        // follow: the slot's node is unreachable or the topology is changing.
        || matches!(error.code(), Some("BUSY" | "TRYAGAIN" | "CLUSTERDOWN" | "MOVED" | "ASK"))
        // Refused credentials (an ACL user deleted, a password rotated): the
        // connection reconnects with the current ones, so a retry may help.
        || refuses_credentials(error)
    {
        Fault::Unreachable
    } else {
        Fault::Other
    }
}

/// Whether Redis refused the connection's credentials: a wrong password or
/// an unknown (or deleted) ACL user (`WRONGPASS`, or redis-rs'
/// AuthenticationFailed), or none given where one is needed (`NOAUTH`).
pub fn refuses_credentials(error: &RedisError) -> bool {
    let text = error.to_string();
    error.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(error.code(), Some("WRONGPASS" | "NOAUTH"))
        || text.contains("WRONGPASS")
        || text.contains("NOAUTH")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server_error(reply: &[u8]) -> RedisError {
        match redis::parse_redis_value(reply).and_then(redis::Value::extract_error) {
            Err(e) => e,
            Ok(value) => panic!("not an error reply: {value:?}"),
        }
    }

    #[test]
    fn each_code_the_sidecar_acts_on_is_its_kind() {
        let cases: [(&[u8], Fault); 12] = [
            (b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n", Fault::WrongType),
            (b"-NOGROUP No such key 's' or consumer group 'g'\r\n", Fault::NoGroup),
            (b"-UNBLOCKED the stream key no longer exists\r\n", Fault::NoGroup),
            (
                b"-UNBLOCKED force unblock from blocking operation, instance state changed (master -> replica?)\r\n",
                Fault::NotPrimary,
            ),
            (b"-READONLY You can't write against a read only replica.\r\n", Fault::NotPrimary),
            (
                b"-MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.\r\n",
                Fault::NotPrimary,
            ),
            (b"-ERR no such key\r\n", Fault::NoSuchKey),
            (b"-BUSYGROUP Consumer Group name already exists\r\n", Fault::BusyGroup),
            (b"-NOPERM this user has no permissions to run the 'xadd' command\r\n", Fault::NoPermission),
            (b"-LOADING Redis is loading the dataset in memory\r\n", Fault::NotPrimary),
            (b"-WRONGPASS invalid username-password pair or user is disabled.\r\n", Fault::Unreachable),
            (b"-NOAUTH Authentication required.\r\n", Fault::Unreachable),
        ];
        for (reply, kind) in cases {
            assert_eq!(fault(&server_error(reply)), kind, "{}", String::from_utf8_lossy(reply));
        }
        assert_eq!(fault(&server_error(b"-ERR syntax error\r\n")), Fault::Other);
    }

    #[test]
    fn refused_credentials_are_told_from_other_errors() {
        let refused = [
            &b"-WRONGPASS invalid username-password pair or user is disabled.\r\n"[..],
            b"-NOAUTH Authentication required.\r\n",
        ];
        for reply in refused {
            assert!(refuses_credentials(&server_error(reply)), "{}", String::from_utf8_lossy(reply));
        }
        assert!(refuses_credentials(&RedisError::from((redis::ErrorKind::AuthenticationFailed, "refused"))));
        assert!(!refuses_credentials(&server_error(b"-NOPERM this user has no permissions\r\n")));
        assert!(!refuses_credentials(&server_error(b"-ERR syntax error\r\n")));
    }

    #[test]
    fn a_readonly_inside_a_script_error_is_not_primary() {
        let error = server_error(b"-ERR user_script:1: READONLY You can't write against a read only replica.\r\n");
        assert_eq!(fault(&error), Fault::NotPrimary);
    }

    #[test]
    fn a_code_inside_a_script_error_is_found() {
        let error =
            server_error(b"-ERR user_script:12: WRONGTYPE Operation against a key holding the wrong kind of value\r\n");
        assert_eq!(fault(&error), Fault::WrongType);
    }
}
