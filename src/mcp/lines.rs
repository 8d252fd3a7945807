//! The stdio lines in front of rmcp's transport: what rmcp would drop or
//! answer wrongly is answered here, per JSON-RPC 2.0, and everything else
//! passes through unchanged.
//!
//! rmcp skips a line that is not JSON without a word; it answers a request
//! it cannot decode (no method, params not an object) without its id; and a
//! `tools/call` without a tool name gets -32601 "tools/call", as if the
//! method did not exist. A client waiting on that id waits for ever. Here
//! the first gets -32700 (parse error, id null), the others -32600 or
//! -32602 with their id and what is wrong; a batch, an id that is neither
//! a string nor a number, or a `jsonrpc` other than "2.0" get -32600
//! (with the id when it is one), and a notification before the first
//! request, which made rmcp end the session, is dropped (D130). A line
//! longer than [`MAX_LINE`], which rmcp would drop without a word, is
//! never held in memory: it gets -32600 with id null (D183).

use serde_json::{Value, json};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

/// The id of the answer after which the server ends by the signal a
/// rewind let wait (D353); `None`: no such answer is due.
static END_AFTER: std::sync::Mutex<Option<Value>> = std::sync::Mutex::new(None);

/// End the server by the deferred signal once the answer to request `id`
/// is written: before, the client would never get the rewind's result;
/// without it, one Ctrl-C left a server that went on starting rewinds
/// until its input closed (helper-93).
pub fn end_after_answer(id: Value) {
    *END_AFTER.lock().unwrap_or_else(|e| e.into_inner()) = Some(id);
}

/// Whether `line` (one JSON-RPC message) answers the request
/// [`end_after_answer`] named.
fn ends_the_server(line: &[u8]) -> bool {
    let due = END_AFTER.lock().unwrap_or_else(|e| e.into_inner());
    let Some(id) = due.as_ref() else {
        return false;
    };
    serde_json::from_slice::<Value>(line).is_ok_and(|m| {
        m.get("id") == Some(id) && (m.get("result").is_some() || m.get("error").is_some())
    })
}

/// Serve `rmcp_io`'s far ends on stdin/stdout, filtering as above, until
/// stdin closes and rmcp has written its last line.
pub async fn pump<I, O>(
    stdin: I,
    mut stdout: O,
    to_rmcp: tokio::io::DuplexStream,
    from_rmcp: tokio::io::DuplexStream,
) -> std::io::Result<()>
where
    I: AsyncRead + Unpin + Send + 'static,
    O: AsyncWrite + Unpin,
{
    let (answers, mut answered) = mpsc::unbounded_channel::<Vec<u8>>();
    let input = tokio::spawn(forward_requests(stdin, to_rmcp, answers));
    let mut from_rmcp = BufReader::new(from_rmcp);
    let mut line = Vec::new();
    loop {
        tokio::select! {
            n = from_rmcp.read_until(b'\n', &mut line) => {
                if n? == 0 {
                    break;
                }
                stdout.write_all(&line).await?;
                stdout.flush().await?;
                if ends_the_server(&line) {
                    rewind_platform::die_of_deferred_signal();
                }
                line.clear();
            }
            Some(answer) = answered.recv() => {
                stdout.write_all(&answer).await?;
                stdout.flush().await?;
            }
        }
    }
    // rmcp is done; answers made after its last line still go out.
    input.abort();
    while let Ok(answer) = answered.try_recv() {
        stdout.write_all(&answer).await?;
    }
    stdout.flush().await
}

/// The longest request line passed on: rmcp's own limit
/// (`DEFAULT_MAX_LINE_LENGTH`), past which it drops a line unanswered.
const MAX_LINE: usize = 16 << 20;

/// Read one line (with its newline) into `line`, holding at most `max`
/// bytes of it: a longer line is read to its end and dropped, and its
/// length returned as `Err`. `Ok(0)` at the end of the input.
async fn read_line_capped<R: AsyncBufRead + Unpin>(
    input: &mut R,
    line: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<Result<usize, usize>> {
    let mut total = 0usize;
    loop {
        let buf = input.fill_buf().await?;
        if buf.is_empty() {
            break;
        }
        let (n, end) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        if total + n <= max {
            line.extend_from_slice(&buf[..n]);
        } else {
            line.clear();
        }
        total += n;
        input.consume(n);
        if end {
            break;
        }
    }
    Ok(if total > max { Err(total) } else { Ok(total) })
}

/// The answer to a line longer than [`MAX_LINE`]: its id is somewhere in
/// bytes not kept, so it is null, as JSON-RPC says for an id that cannot
/// be read.
fn too_long(len: usize) -> Vec<u8> {
    let message = format!(
        "a request is one line of at most {} MiB; this one was {len} bytes and was not read",
        MAX_LINE >> 20
    );
    let mut v =
        json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32600, "message": message}})
            .to_string()
            .into_bytes();
    v.push(b'\n');
    v
}

/// Copy stdin's lines to rmcp, answering the ones it would mishandle.
async fn forward_requests<I: AsyncRead + Unpin>(
    stdin: I,
    mut to_rmcp: tokio::io::DuplexStream,
    answers: mpsc::UnboundedSender<Vec<u8>>,
) -> std::io::Result<()> {
    let mut stdin = BufReader::new(stdin);
    let mut line = Vec::new();
    // rmcp ends the session on a notification that comes before the
    // first request (a `notifications/cancelled` of a client restarting):
    // such a notification needs no answer, so it is dropped here.
    let mut requested = false;
    loop {
        line.clear();
        match read_line_capped(&mut stdin, &mut line, MAX_LINE).await? {
            Ok(0) => break,
            Ok(_) => {}
            Err(len) => {
                let _ = answers.send(too_long(len));
                continue;
            }
        }
        match answer(&line) {
            Some(a) if a.is_empty() => {}
            Some(a) => {
                let _ = answers.send(a);
            }
            None if !requested && (is_notification(&line) || is_response(&line)) => {}
            None => {
                requested |= !line.iter().all(u8::is_ascii_whitespace);
                to_rmcp.write_all(&line).await?
            }
        }
    }
    // EOF for rmcp: the session ends as it did on stdin's.
    to_rmcp.shutdown().await
}

/// A response (`result` or `error` with an id): before the first
/// request it answers nothing this server asked, and rmcp ended the
/// session on it (helper-61, D303).
fn is_response(line: &[u8]) -> bool {
    serde_json::from_slice::<Value>(line).is_ok_and(|v| {
        v.get("method").is_none() && (v.get("result").is_some() || v.get("error").is_some())
    })
}

fn is_notification(line: &[u8]) -> bool {
    serde_json::from_slice::<Value>(line)
        .is_ok_and(|v| v.get("method").is_some() && v.get("id").is_none())
}

/// The error answer for a line rmcp would mishandle (empty: the line is
/// dropped unanswered), else None.
fn answer(line: &[u8]) -> Option<Vec<u8>> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    let error = |id: Value, code: i64, message: String| {
        let mut v =
            json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
                .to_string()
                .into_bytes();
        v.push(b'\n');
        Some(v)
    };
    let request: Value = match serde_json::from_slice(line) {
        Ok(v) => v,
        Err(e) => {
            return error(
                Value::Null,
                -32700,
                format!(
                    "parse error: the line is not JSON ({e}); send one JSON-RPC message per line"
                ),
            );
        }
    };
    // Not one request object (a batch, which MCP does not take, or a
    // scalar): nothing to take an id from.
    let Some(object) = request.as_object() else {
        return error(
            Value::Null,
            -32600,
            "invalid request: send one JSON-RPC request object per line (batches are not supported)".into(),
        );
    };
    // `params` and its `_meta` are objects in every MCP message; rmcp
    // answers others with no id member, which a client waits on for
    // ever, and answers a notification, which JSON-RPC forbids
    // (helper-61, D303).
    let params = object.get("params");
    let malformed = params.is_some_and(|p| !p.is_object() && !p.is_null())
        || params
            .and_then(|p| p.get("_meta"))
            .is_some_and(|m| !m.is_object() && !m.is_null());
    let Some(id) = object.get("id") else {
        // A notification passes, unless rmcp would answer it: one it
        // cannot read is dropped, as a notification gets no answer. An
        // object that is neither that nor a request got rmcp's "Invalid
        // request" with no id member, which JSON-RPC 2.0 requires as
        // null (helper-31, D214).
        if object.get("method").is_some_and(Value::is_string) {
            return malformed.then(Vec::new);
        }
        return error(
            Value::Null,
            -32600,
            "invalid request: a request needs a \"method\" and an \"id\" (a notification, a \"method\" alone)".into(),
        );
    };
    // An id must be a string or a number; rmcp answered others, and a
    // wrong `jsonrpc`, with no id at all, and dropped without a word the
    // ids it cannot hold (null, a fraction, past i64: helper-24).
    // Those it could not decode get their own id back with the error.
    let fits_rmcp = id.is_string() || id.is_i64();
    if !fits_rmcp {
        let echo = if id.is_number() || id.is_null() {
            id.clone()
        } else {
            Value::Null
        };
        return error(
            echo,
            -32600,
            "invalid request: an id is a string or an integer".into(),
        );
    }
    if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return error(
            id.clone(),
            -32600,
            "invalid request: \"jsonrpc\" must be \"2.0\"".into(),
        );
    }
    let Some(method) = request.get("method").and_then(Value::as_str) else {
        if request.get("result").is_some() || request.get("error").is_some() {
            return None;
        }
        return error(
            id.clone(),
            -32600,
            "invalid request: a request needs a \"method\"".into(),
        );
    };
    // Every MCP method's params is an object; rmcp answers others without
    // the id, so the caller never learns its request failed.
    if malformed {
        return error(
            id.clone(),
            -32602,
            format!("invalid params: the params of {method}, and their _meta, must be objects"),
        );
    }
    if method != "tools/call" {
        return None;
    }
    let name = request.get("params").and_then(|p| p.get("name"));
    let arguments = request.get("params").and_then(|p| p.get("arguments"));
    if name.is_some_and(Value::is_string) && arguments.is_none_or(|a| a.is_object() || a.is_null())
    {
        return None;
    }
    error(
        id.clone(),
        -32602,
        "invalid params: tools/call needs params.name, a tool's name (call tools/list), and params.arguments, an object".into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(line: &str) -> Option<(Value, i64)> {
        let a = answer(line.as_bytes())?;
        let v: Value = serde_json::from_slice(&a).expect("an answer is JSON");
        Some((v["id"].clone(), v["error"]["code"].as_i64().expect("code")))
    }

    #[test]
    fn a_line_that_is_not_json_gets_a_parse_error_with_a_null_id() {
        assert_eq!(code("this is not json\n"), Some((Value::Null, -32700)));
        assert_eq!(
            code("{\"jsonrpc\":\"2.0\",\"id\":1,\n"),
            Some((Value::Null, -32700))
        );
    }

    #[test]
    fn a_tool_call_without_a_name_gets_invalid_params_with_its_id() {
        let line = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"arguments":{}}}"#;
        assert_eq!(code(line), Some((json!(7), -32602)));
        let line = r#"{"jsonrpc":"2.0","id":"x","method":"tools/call","params":{"name":3}}"#;
        assert_eq!(code(line), Some((json!("x"), -32602)));
    }

    /// D303: a `_meta` that is no object is answered with the id; a
    /// notification rmcp cannot read is dropped, never answered.
    #[test]
    fn a_malformed_meta_is_answered_with_its_id_and_a_notification_never() {
        for method in ["ping", "tools/list", "tools/call", "initialize"] {
            for meta in ["5", "\"x\"", "[]"] {
                let line = format!(
                    r#"{{"jsonrpc":"2.0","id":5,"method":"{method}","params":{{"name":"list","_meta":{meta}}}}}"#
                );
                assert_eq!(code(&line), Some((json!(5), -32602)), "{line}");
            }
        }
        for line in [
            r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":"bad"}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized","params":{"_meta":1}}"#,
        ] {
            assert_eq!(answer(line.as_bytes()), Some(Vec::new()), "{line}");
        }
        let fine =
            r#"{"jsonrpc":"2.0","id":1,"method":"ping","params":{"_meta":{"progressToken":1}}}"#;
        assert_eq!(answer(fine.as_bytes()), None);
        assert!(is_response(br#"{"jsonrpc":"2.0","id":1,"result":{}}"#));
        assert!(!is_response(br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#));
    }

    #[test]
    fn a_request_rmcp_cannot_decode_is_answered_with_its_id() {
        let line = r#"{"jsonrpc":"2.0","id":11,"method":"tools/list","params":5}"#;
        assert_eq!(code(line), Some((json!(11), -32602)));
        let line = r#"{"jsonrpc":"2.0","id":9}"#;
        assert_eq!(code(line), Some((json!(9), -32600)));
    }

    /// helper-31: an object with neither an id nor a method got rmcp's
    /// -32600 with no id member; JSON-RPC 2.0 wants `"id": null`. A
    /// notification (a method, no id) still passes.
    #[test]
    fn neither_a_request_nor_a_notification_gets_a_null_id() {
        for line in ["{}", r#"{"foo":1}"#, r#"{"jsonrpc":"2.0"}"#] {
            assert_eq!(code(line), Some((Value::Null, -32600)), "{line}");
            let a = answer(line.as_bytes()).expect("an answer");
            let v: Value = serde_json::from_slice(&a).expect("JSON");
            assert_eq!(v.get("id"), Some(&Value::Null), "{line}: {v}");
        }
        let note = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
        assert_eq!(code(note), None);
    }

    /// helper-14: these got -32600 with no id member at all (a client
    /// waits for ever on id 10), or -32601 for bad arguments.
    #[test]
    fn malformed_requests_are_answered_per_json_rpc() {
        let line = r#"{"jsonrpc":"1.0","id":10,"method":"ping"}"#;
        assert_eq!(code(line), Some((json!(10), -32600)));
        let line = r#"{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}"#;
        assert_eq!(code(line), Some((Value::Null, -32600)));
        let line = r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#;
        assert_eq!(code(line), Some((Value::Null, -32600)));
        // rmcp dropped these without an answer (helper-24).
        let line = r#"{"jsonrpc":"2.0","id":1.5,"method":"ping"}"#;
        assert_eq!(code(line), Some((json!(1.5), -32600)));
        let line = r#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#;
        assert_eq!(code(line), Some((Value::Null, -32600)));
        let line = r#"{"jsonrpc":"2.0","id":18446744073709551616,"method":"ping"}"#;
        assert_eq!(code(line).map(|(_, c)| c), Some(-32600));
        let line = r#"{"jsonrpc":"2.0","id":9223372036854775808,"method":"ping"}"#;
        assert_eq!(code(line), Some((json!(9223372036854775808u64), -32600)));
        let line = r#"{"jsonrpc":"2.0","id":-9223372036854775808,"method":"ping"}"#;
        assert_eq!(code(line), None, "an i64 id is rmcp's to answer");
        for args in ["[]", "\"x\"", "3"] {
            let line = format!(
                r#"{{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{{"name":"list","arguments":{args}}}}}"#
            );
            assert_eq!(code(&line), Some((json!(4), -32602)), "{line}");
        }
    }

    /// A line past rmcp's limit is answered, not dropped, and the lines
    /// around it are read as usual; it is never held whole.
    #[test]
    fn a_line_too_long_is_answered_and_the_next_one_is_read() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let mut input = Vec::new();
        input.extend_from_slice(b"{\"id\":1}\n");
        input.extend_from_slice(&[b'x'; 100]);
        input.extend_from_slice(b"\n{\"id\":2}\n{\"id\":3}");
        // A 7-byte buffer: lines arrive in pieces, as from a pipe.
        let mut reader = BufReader::with_capacity(7, &input[..]);
        let mut line = Vec::new();
        let mut read = Vec::new();
        runtime.block_on(async {
            loop {
                line.clear();
                match read_line_capped(&mut reader, &mut line, 50)
                    .await
                    .expect("read")
                {
                    Ok(0) => break,
                    Ok(_) => read.push(Ok(String::from_utf8(line.clone()).expect("utf-8"))),
                    Err(len) => {
                        assert!(line.capacity() <= 64, "held {} bytes", line.capacity());
                        read.push(Err(len))
                    }
                }
            }
        });
        assert_eq!(
            read,
            vec![
                Ok("{\"id\":1}\n".to_string()),
                Err(101),
                Ok("{\"id\":2}\n".to_string()),
                Ok("{\"id\":3}".to_string()),
            ]
        );
        let answer: Value = serde_json::from_slice(&too_long(101)).expect("JSON");
        assert_eq!(answer["error"]["code"], -32600);
        assert_eq!(answer["id"], Value::Null);
    }

    #[test]
    fn a_notification_before_any_request_is_recognised() {
        assert!(is_notification(
            br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}"#
        ));
        assert!(!is_notification(
            br#"{"jsonrpc":"2.0","id":1,"method":"initialize"}"#
        ));
    }

    #[test]
    fn everything_else_passes_through_to_rmcp() {
        for line in [
            "\n",
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"checkpoint"}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            r#"{"jsonrpc":"2.0","id":2,"method":"no/such/method"}"#,
            r#"{"jsonrpc":"2.0","id":3,"result":{}}"#,
        ] {
            assert_eq!(code(line), None, "{line}");
        }
    }
}
