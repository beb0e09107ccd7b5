//! What an SDK error means: its classified [`ErrorKind`], named.

use super::*;

/// Whether an error's cause chain is a TLS certificate verification failure (rustls:
/// "invalid peer certificate: UnknownIssuer", "NotValidForName", expired, …).
pub(super) fn tls_refused(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if matches!(
            e.downcast_ref::<rustls::Error>(),
            Some(rustls::Error::InvalidCertificate(_))
        ) || e.to_string().contains("invalid peer certificate")
        {
            return true;
        }
        cur = e.source();
    }
    false
}

/// Whether the SDK found no credentials at all (every provider of the default chain declined):
/// a setting to fix, never a network hiccup to retry for the whole budget.
pub(super) fn no_credentials(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if matches!(
            e.downcast_ref::<aws_credential_types::provider::error::CredentialsError>(),
            Some(aws_credential_types::provider::error::CredentialsError::CredentialsNotLoaded(_))
        ) {
            return true;
        }
        cur = e.source();
    }
    false
}

/// Map an SDK error to a classified [`Error`] (DESIGN §9).
/// An AWS SDK error as blobsnap's: timeouts and unreachable servers `Transient`, HTTP
/// statuses and S3 codes by [`kind_of_status`].
pub fn classify<E>(what: String, err: SdkError<E, HttpResponse>) -> Error
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    match &err {
        SdkError::ConstructionFailure(_) => {
            Error::invalid(format!("{what}: could not build the request")).with_source(err)
        }
        SdkError::TimeoutError(_) => {
            Error::transient(format!("{what}: timed out")).with_source(err)
        }
        SdkError::DispatchFailure(d) => {
            if d.is_user() {
                Error::invalid(format!("{what}: bad request setup (endpoint?)")).with_source(err)
            } else if tls_refused(&err) {
                // The server answered with a certificate this client does not trust: a
                // setting to fix, not a network hiccup to retry.
                Error::new(
                    ErrorKind::Permanent,
                    format!("{what}: the server's TLS certificate is not trusted (set s3.ca-bundle / BLOBSNAP_S3_CA_BUNDLE to the CA that signed it, or check the endpoint's host name)"),
                )
                .with_source(err)
            } else if no_credentials(&err) {
                Error::new(
                    ErrorKind::Permanent,
                    format!("{what}: no AWS credentials found (the default chain: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile, web identity, ECS, instance metadata)"),
                )
                .with_source(err)
            } else {
                Error::transient(format!("{what}: could not reach the server")).with_source(err)
            }
        }
        SdkError::ResponseError(r) => {
            let status = r.raw().status().as_u16();
            // A success whose body was cut (connection lost mid-response) is ambiguous, not
            // final: the request may well have taken effect. Retry (create-only puts and
            // multipart completes then settle by reading back).
            let kind = if (200..300).contains(&status) {
                ErrorKind::Transient
            } else {
                kind_of_status(status, None)
            };
            let e = Error::new(kind, format!("{what}: unreadable response (HTTP {status})"))
                .with_source(err);
            if is_throttling(status, None) {
                e.throttling()
            } else {
                e
            }
        }
        SdkError::ServiceError(s) => {
            let status = s.raw().status().as_u16();
            let code = s.err().code().map(str::to_string);
            let msg = s.err().message().map(str::to_string);
            let kind = kind_of_status(status, code.as_deref());
            let mut text = format!("{what}: HTTP {status}");
            if let Some(c) = &code {
                text.push_str(&format!(" {c}"));
            }
            if let Some(m) = &msg {
                text.push_str(&format!(" ({m})"));
            }
            match (status, code.as_deref()) {
                (_, Some("NoSuchBucket")) => text.push_str(": the bucket does not exist"),
                (403, _) => text.push_str(
                    ": access denied (credentials, bucket policy; on AWS a missing key also gives 403 without s3:ListBucket)",
                ),
                (301, _) | (_, Some("PermanentRedirect")) | (_, Some("AuthorizationHeaderMalformed")) => {
                    text.push_str(": wrong region for this bucket?")
                }
                _ => {}
            }
            let e = Error::new(kind, text);
            if is_throttling(status, code.as_deref()) {
                e.throttling()
            } else {
                e
            }
        }
        _ => Error::transient(format!("{what}: request failed")).with_source(err),
    }
}

/// Whether an S3 error response asks the client to slow down: `SlowDown` (S3's 503),
/// `429 Too Many Requests`, or the throttling codes some S3-compatible servers use. The whole
/// transfer budget narrows on it ([`crate::blobstore::limit`]).
pub fn is_throttling(status: u16, code: Option<&str>) -> bool {
    matches!(
        code,
        Some("SlowDown")
            | Some("TooManyRequests")
            | Some("Throttling")
            | Some("ThrottlingException")
            | Some("RequestLimitExceeded")
    ) || status == 429
        || (code.is_none() && status == 503)
}

/// The kind of an S3 error response, by error code first, then HTTP status.
pub fn kind_of_status(status: u16, code: Option<&str>) -> ErrorKind {
    match code {
        Some("NoSuchKey") | Some("NoSuchUpload") => return ErrorKind::NotFound,
        Some("NoSuchBucket")
        | Some("AccessDenied")
        | Some("InvalidAccessKeyId")
        | Some("SignatureDoesNotMatch")
        | Some("PermanentRedirect")
        | Some("AuthorizationHeaderMalformed") => return ErrorKind::Permanent,
        Some("PreconditionFailed") => return ErrorKind::Conflict,
        Some("BadDigest")
        | Some("InvalidDigest")
        | Some("XAmzContentSHA256Mismatch")
        | Some("XAmzContentChecksumMismatch") => return ErrorKind::Corrupt,
        Some("SlowDown")
        | Some("RequestTimeout")
        | Some("InternalError")
        | Some("ServiceUnavailable")
        | Some("ConditionalRequestConflict")
        | Some("RequestTimeTooSkewed")
        | Some("OperationAborted") => return ErrorKind::Transient,
        Some("InvalidRange") => return ErrorKind::InvalidInput,
        Some("NotImplemented") => return ErrorKind::Permanent,
        _ => {}
    }
    match status {
        404 => ErrorKind::NotFound,
        501 => ErrorKind::Permanent, // not implemented by this server: retrying cannot help
        412 => ErrorKind::Conflict,
        416 => ErrorKind::InvalidInput,
        408 | 409 | 429 => ErrorKind::Transient,
        500..=599 => ErrorKind::Transient,
        _ => ErrorKind::Permanent,
    }
}

pub(super) fn to_system_time(t: Option<&aws_smithy_types::DateTime>) -> Option<SystemTime> {
    t.and_then(|t| SystemTime::try_from(*t).ok())
}
