//! Email over SMTP (lettre's tokio transport, rustls): the operator's relay from
//! `--smtp-url` (`smtp://host:port`, `smtps://user:pass@host:465`, or `smtp://…?tls=required`
//! for STARTTLS) and the sender from `--smtp-from`.

use std::time::Duration;

use lettre::message::{Mailbox, header::ContentType};
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};

/// The relay and the sender.
pub struct Mailer {
    transport: AsyncSmtpTransport<Tokio1Executor>,
    from: Mailbox,
    /// The host part of each mail's Message-ID (the portal's host).
    domain: String,
}

impl Mailer {
    /// A mailer for `url` sending as `from` (e.g. `Berth <berth@example.com>`). The portal
    /// at `public_url` names the mails' Message-IDs.
    pub fn new(url: &str, from: &str, public_url: &str) -> Result<Mailer, String> {
        let from: Mailbox = from.parse().map_err(|e| format!("--smtp-from {from:?}: {e}"))?;
        let transport = AsyncSmtpTransport::<Tokio1Executor>::from_url(url)
            .map_err(|e| format!("--smtp-url: {e}"))?
            .timeout(Some(Duration::from_secs(20)))
            .build();
        let domain = url::Url::parse(public_url)
            .ok()
            .and_then(|u| u.host_str().map(str::to_owned))
            .unwrap_or_else(|| "berth.invalid".to_owned());
        Ok(Mailer { transport, from, domain })
    }

    /// Sends one mail. `key` names it: a mail sent twice (after a crash between sending
    /// and marking it sent) carries the same Message-ID, which mail clients fold into one.
    pub async fn send(&self, key: &str, to: &str, subject: &str, body: &str) -> Result<(), String> {
        let to: Mailbox = to.parse().map_err(|e| format!("recipient {to:?}: {e}"))?;
        let message = Message::builder()
            .from(self.from.clone())
            .to(to)
            .subject(subject)
            .message_id(Some(format!("<{key}@{}>", self.domain)))
            .header(ContentType::TEXT_PLAIN)
            .body(body.to_owned())
            .map_err(|e| format!("cannot build the mail: {e}"))?;
        self.transport.send(message).await.map(|_| ()).map_err(|e| format!("SMTP: {e}"))
    }
}
