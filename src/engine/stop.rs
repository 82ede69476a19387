//! Stop strings over a stream of text pieces: text that might be the start of a stop string is
//! held back until it is decided, so a stop string never leaks into the output.

/// Result of feeding a piece of text.
#[derive(Debug, PartialEq, Eq)]
pub enum StopCheck {
    /// Emit this text (possibly empty) and continue.
    Continue(String),
    /// A stop string matched: emit this text (what preceded the match) and stop.
    Stop { text: String, matched: String },
}

pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> Self {
        Self {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
        }
    }

    pub fn feed(&mut self, piece: &str) -> StopCheck {
        if self.stops.is_empty() {
            return StopCheck::Continue(piece.to_string());
        }
        self.held.push_str(piece);
        // Earliest complete match wins.
        let mut best: Option<(usize, &String)> = None;
        for s in &self.stops {
            if let Some(pos) = self.held.find(s.as_str()) {
                if best.is_none_or(|(b, _)| pos < b) {
                    best = Some((pos, s));
                }
            }
        }
        if let Some((pos, s)) = best {
            let matched = s.clone();
            let text = self.held[..pos].to_string();
            self.held.clear();
            return StopCheck::Stop { text, matched };
        }
        // Hold back the longest suffix that is a proper prefix of some stop string.
        let keep = self
            .stops
            .iter()
            .map(|s| longest_suffix_prefix(&self.held, s))
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        StopCheck::Continue(out)
    }

    /// Release held text at the end of generation.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

/// Length of the longest suffix of `text` that is a proper prefix of `pat` (on char boundaries).
pub fn longest_suffix_prefix(text: &str, pat: &str) -> usize {
    let max = text.len().min(pat.len().saturating_sub(1));
    (1..=max)
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n)
                && pat
                    .as_bytes()
                    .starts_with(&text.as_bytes()[text.len() - n..])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_back_partial_and_stops_on_full() {
        let mut m = StopMatcher::new(vec!["END".into()]);
        assert_eq!(m.feed("abc E"), StopCheck::Continue("abc ".into()));
        assert_eq!(m.feed("N"), StopCheck::Continue("".into()));
        assert_eq!(
            m.feed("Dxyz"),
            StopCheck::Stop {
                text: "".into(),
                matched: "END".into()
            }
        );
    }

    #[test]
    fn false_alarm_released() {
        let mut m = StopMatcher::new(vec!["END".into()]);
        assert_eq!(m.feed("E"), StopCheck::Continue("".into()));
        assert_eq!(m.feed("x"), StopCheck::Continue("Ex".into()));
        assert_eq!(m.feed("EN"), StopCheck::Continue("".into()));
        assert_eq!(m.flush(), "EN");
    }

    #[test]
    fn earliest_of_several_and_unicode() {
        let mut m = StopMatcher::new(vec!["é!".into(), "b".into()]);
        assert_eq!(m.feed("aé"), StopCheck::Continue("a".into()));
        assert_eq!(
            m.feed("!b"),
            StopCheck::Stop {
                text: "".into(), // "a" was already released by the first feed
                matched: "é!".into()
            }
        );
    }
}
