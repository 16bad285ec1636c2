//! The data nodes' password from `--redis-password-file`, read again when
//! Redis refuses the one in use.
//!
//! Kubernetes rotates a Secret by rewriting the file it mounts; Redis gets
//! the new password (`ACL SETUSER … resetpass >new`) and the old connections
//! stay authenticated until they are closed. The first reconnect after that
//! is refused (`WRONGPASS`), and a password read once at start would be
//! refused for good. So each refusal reads the file again
//! ([`PasswordFile::reread`]); when its text changed, the primary's client
//! takes it ([`super::primary::Primary::credentials_refused`]), and every
//! connection made from then on uses it: the shared connection, the group
//! readers and the durable writer, which all connect from that client.

use std::{
    path::{Path, PathBuf},
    sync::{Mutex, PoisonError},
};

use redis::ConnectionInfo;
use tracing::{info, warn};

/// Reads a one-line secret file (a password, a token): its text, trimmed.
///
/// Errors, as a reason to show after the path: the file cannot be read, is
/// not UTF-8 text, or holds nothing but white space.
pub fn read_text(path: &Path) -> Result<String, String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    let text = String::from_utf8(bytes).map_err(|_| "not UTF-8 text".to_owned())?;
    let text = text.trim();
    if text.is_empty() {
        return Err("the file is empty".to_owned());
    }
    Ok(text.to_owned())
}

/// `--redis-password-file` and the password last read from it.
pub struct PasswordFile {
    path: PathBuf,
    /// The password in use, and the last reason the file could not be read
    /// (logged once per reason, not once per refusal).
    state: Mutex<ReadState>,
}

struct ReadState {
    password: String,
    unreadable: Option<String>,
}

impl PasswordFile {
    /// The file at `path`, whose text at start was `password`.
    pub fn new(path: PathBuf, password: String) -> PasswordFile {
        PasswordFile { path, state: Mutex::new(ReadState { password, unreadable: None }) }
    }

    /// The password in use.
    pub fn password(&self) -> String {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).password.clone()
    }

    /// Reads the file again after Redis refused the password in use: the new
    /// password when the text changed (logged once, without it), else
    /// `None`. A file that cannot be read keeps the password in use, with a
    /// warning once per reason.
    pub fn reread(&self) -> Option<String> {
        let read = read_text(&self.path);
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let path = self.path.display();
        match read {
            Err(reason) => {
                if state.unreadable.as_deref() != Some(reason.as_str()) {
                    warn!("Redis refused the password, and --redis-password-file {path} cannot be read again ({reason}): the password read before stays in use");
                    state.unreadable = Some(reason);
                }
                None
            }
            Ok(text) => {
                state.unreadable = None;
                if text == state.password {
                    return None;
                }
                info!("Redis refused the password, and --redis-password-file {path} holds a new one: connecting with it from now on");
                state.password = text.clone();
                Some(text)
            }
        }
    }
}

/// `info` with `password` in place of its own, when given.
pub(super) fn with_password(info: ConnectionInfo, password: Option<&str>) -> ConnectionInfo {
    match password {
        Some(password) => {
            let settings = info.redis_settings().clone().set_password(password);
            info.set_redis_settings(settings)
        }
        None => info,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_file_gives_its_new_password_once() {
        let dir = std::env::temp_dir().join(format!("echomq-password-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("password");
        std::fs::write(&path, "first\n").unwrap();
        let file = PasswordFile::new(path.clone(), read_text(&path).unwrap());
        assert_eq!(file.reread(), None, "unchanged");
        std::fs::write(&path, "second\n").unwrap();
        assert_eq!(file.reread().as_deref(), Some("second"));
        assert_eq!(file.reread(), None, "taken already");
        std::fs::write(&path, "  \n").unwrap();
        assert_eq!(file.reread(), None, "an empty file keeps the password in use");
        assert_eq!(file.password(), "second");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
