//! Unit tests of the template language (filled below).
