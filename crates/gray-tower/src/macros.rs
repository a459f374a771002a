//! Small macros shared by the middleware modules.

/// Defines `get_ref`, `get_mut` and `into_inner` for a middleware whose inner service is
/// the field `inner` (as tower-http does).
macro_rules! define_inner_service_accessors {
    () => {
        /// The inner service.
        pub fn get_ref(&self) -> &S {
            &self.inner
        }

        /// The inner service, mutably.
        pub fn get_mut(&mut self) -> &mut S {
            &mut self.inner
        }

        /// Unwraps the inner service.
        pub fn into_inner(self) -> S {
            self.inner
        }
    };
}
