//! The two exposition formats `/metrics` speaks, and which one a scraper gets.
//!
//! `prometheus-client` writes OpenMetrics 1.0. Prometheus 3 asks for OpenMetrics first
//! (its default `scrape_protocols`) and refuses an answer without a `Content-Type`; a
//! scraper that does not ask for OpenMetrics (`curl`, a Prometheus with `scrape_protocols:
//! [PrometheusText0.0.4]`, older agents) gets the classic text format 0.0.4, which this
//! module derives from the OpenMetrics text.

use std::str::FromStr;

/// `Content-Type` of OpenMetrics 1.0 text.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// `Content-Type` of the Prometheus text format 0.0.4.
pub const TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// An exposition format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0 text.
    OpenMetrics,
    /// Prometheus text 0.0.4.
    Text,
}

impl Format {
    /// Its `Content-Type`.
    pub fn content_type(self) -> &'static str {
        match self {
            Self::OpenMetrics => OPENMETRICS,
            Self::Text => TEXT,
        }
    }

    /// The format to answer a request with this `Accept` header in: OpenMetrics when it is
    /// asked for by name (version 1.0.0 or none) at least as strongly as the text format;
    /// the text format otherwise, also for `*/*` or no header (what a person's `curl` gets).
    pub fn negotiate(accept: Option<&str>) -> Self {
        let mut openmetrics = 0.0_f32;
        let mut text = 0.0_f32;
        for range in accept.unwrap_or_default().split(',') {
            let Ok(mime) = mime::Mime::from_str(range.trim()) else {
                continue;
            };
            let q = mime
                .get_param("q")
                .and_then(|q| q.as_str().parse::<f32>().ok())
                .unwrap_or(1.0);
            let version = mime.get_param("version").map(|v| v.as_str().to_string());
            match (mime.type_().as_str(), mime.subtype().as_str()) {
                ("application", "openmetrics-text")
                    if version.as_deref().is_none_or(|v| v == "1.0.0") =>
                {
                    openmetrics = openmetrics.max(q);
                }
                ("text", "plain") if version.as_deref().is_none_or(|v| v == "0.0.4") => {
                    text = text.max(q);
                }
                _ => {}
            }
        }
        if openmetrics > 0.0 && openmetrics >= text {
            Self::OpenMetrics
        } else {
            Self::Text
        }
    }

    /// `openmetrics` (as `prometheus-client` writes it) in this format.
    pub fn render(self, openmetrics: &str) -> String {
        match self {
            Self::OpenMetrics => openmetrics.to_string(),
            Self::Text => to_text(openmetrics),
        }
    }
}

/// OpenMetrics text to the Prometheus text format 0.0.4: a counter family `x` is `x_total`
/// there (its samples already are), `# UNIT` and `# EOF` do not exist, nor do exemplars;
/// the types OpenMetrics adds become `untyped` (an info family becomes the gauge `x_info`).
pub fn to_text(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    // `# HELP` comes before `# TYPE`, whose type decides the family's name.
    let mut help: Option<(&str, &str)> = None;
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            flush_help(&mut out, help.take());
            help = Some(rest.split_once(' ').unwrap_or((rest, "")));
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (family, kind) = rest.split_once(' ').unwrap_or((rest, "unknown"));
            let (name, kind) = match kind {
                "counter" => (format!("{family}_total"), "counter"),
                "gauge" | "histogram" | "summary" => (family.to_string(), kind),
                "info" => (format!("{family}_info"), "gauge"),
                _ => (family.to_string(), "untyped"),
            };
            match help.take() {
                Some((h, text)) if h == family => {
                    out.push_str(&format!("# HELP {name} {text}\n"));
                }
                other => flush_help(&mut out, other),
            }
            out.push_str(&format!("# TYPE {name} {kind}\n"));
            continue;
        }
        flush_help(&mut out, help.take());
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        out.push_str(without_exemplar(line));
        out.push('\n');
    }
    flush_help(&mut out, help);
    out
}

fn flush_help(out: &mut String, help: Option<(&str, &str)>) {
    if let Some((name, text)) = help {
        out.push_str(&format!("# HELP {name} {text}\n"));
    }
}

/// A sample line without its exemplar (` # {…} value [timestamp]` after the value). The
/// ` # ` is searched after the label set, whose quoted values may hold anything.
fn without_exemplar(line: &str) -> &str {
    let mut after_labels = 0;
    if let Some(open) = line.find('{') {
        let mut quoted = false;
        let mut escaped = false;
        for (i, c) in line[open..].char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' if quoted => escaped = true,
                '"' => quoted = !quoted,
                '}' if !quoted => {
                    after_labels = open + i + 1;
                    break;
                }
                _ => {}
            }
        }
    }
    match line[after_labels..].find(" # ") {
        Some(i) => line[..after_labels + i].trim_end(),
        None => line,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Prometheus 3's `Accept` with its default `scrape_protocols`
    /// (scrape/scrape.go, `acceptHeader`).
    const PROMETHEUS_3: &str = "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2";

    #[test]
    fn prometheus_3_gets_openmetrics_and_curl_gets_text() {
        assert_eq!(Format::negotiate(Some(PROMETHEUS_3)), Format::OpenMetrics);
        assert_eq!(Format::negotiate(None), Format::Text);
        assert_eq!(Format::negotiate(Some("*/*")), Format::Text);
        assert_eq!(
            Format::negotiate(Some("text/plain;version=0.0.4;q=0.3,*/*;q=0.2")),
            Format::Text,
            "Prometheus with scrape_protocols: [PrometheusText0.0.4]"
        );
        assert_eq!(
            Format::negotiate(Some("application/openmetrics-text")),
            Format::OpenMetrics
        );
    }

    #[test]
    fn the_stronger_preference_wins_and_q_0_refuses() {
        assert_eq!(
            Format::negotiate(Some("text/plain;q=0.9, application/openmetrics-text;q=0.5")),
            Format::Text
        );
        assert_eq!(
            Format::negotiate(Some("application/openmetrics-text;q=0")),
            Format::Text
        );
        assert_eq!(
            Format::negotiate(Some("application/openmetrics-text;version=2.0.0")),
            Format::Text,
            "a version we do not write"
        );
        assert_eq!(Format::negotiate(Some("not a media type,,")), Format::Text);
    }

    const OM: &str = "# HELP tessera_x_passes Passes.\n# TYPE tessera_x_passes counter\ntessera_x_passes_total{result=\"ok\"} 3\n# HELP tessera_x_took_seconds Time.\n# TYPE tessera_x_took_seconds histogram\n# UNIT tessera_x_took_seconds seconds\ntessera_x_took_seconds_sum 0.5\ntessera_x_took_seconds_count 1\ntessera_x_took_seconds_bucket{le=\"+Inf\"} 1 # {trace=\"a # {b}\"} 0.5\n# HELP tessera_x_ready Ready.\n# TYPE tessera_x_ready gauge\ntessera_x_ready 1\n# TYPE tessera_x_other unknown\ntessera_x_other{v=\"a } # b\"} 2\n# EOF\n";

    #[test]
    fn text_names_counter_families_by_their_samples_and_drops_what_0_0_4_lacks() {
        assert_eq!(
            to_text(OM),
            "# HELP tessera_x_passes_total Passes.\n# TYPE tessera_x_passes_total counter\ntessera_x_passes_total{result=\"ok\"} 3\n# HELP tessera_x_took_seconds Time.\n# TYPE tessera_x_took_seconds histogram\ntessera_x_took_seconds_sum 0.5\ntessera_x_took_seconds_count 1\ntessera_x_took_seconds_bucket{le=\"+Inf\"} 1\n# HELP tessera_x_ready Ready.\n# TYPE tessera_x_ready gauge\ntessera_x_ready 1\n# TYPE tessera_x_other untyped\ntessera_x_other{v=\"a } # b\"} 2\n"
        );
    }

    #[test]
    fn each_format_renders_what_its_content_type_says() {
        assert_eq!(Format::OpenMetrics.render(OM), OM);
        assert!(!Format::Text.render(OM).contains("# EOF"));
        assert!(
            Format::OpenMetrics
                .content_type()
                .starts_with("application/openmetrics-text;")
        );
        assert_eq!(
            Format::Text.content_type(),
            "text/plain; version=0.0.4; charset=utf-8"
        );
    }
}
